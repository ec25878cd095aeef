"""The worker's start-up: a problem the operator must fix stops it before it joins a group."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_a_bad_policy_stops_the_worker_with_one_clear_line() -> None:
    env = {**os.environ, "ASSEMBLER_POLICY_FILE": "no-such-policy",
           "ASSEMBLER_BOOTSTRAP_SERVERS": "127.0.0.1:9"}  # never contacted
    result = subprocess.run([sys.executable, "-m", "worker.cli", "worker"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and "no-such-policy" in entry["message"]
