"""The Makefile's broker targets say what is true, without starting a JVM."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_broker_address_after_broker_stop_prints_no_stale_address(tmp_path: Path) -> None:
    """broker-stop leaves the address file for a restart; the address is only printed while
    the broker runs, and after a stop one line says so (no `make: *** ... Error 1`)."""
    (tmp_path / "bootstrap").write_text("127.0.0.1:9092\n")
    (tmp_path / "broker.pid").write_text("999999\n")  # no such process
    env = {**os.environ, "KAFKA_DIR": str(tmp_path)}
    result = subprocess.run(["make", "-s", "broker-address"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (0, "")  # a clear line, not make's "Error 1"
    assert result.stderr == f"no broker is running from {tmp_path} (make broker-start starts one)\n"


def test_make_help_lists_every_target_with_what_it_does() -> None:
    phony = next(line for line in (REPO / "Makefile").read_text("utf-8").splitlines()
                 if line.startswith(".PHONY:")).split()[1:]
    result = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True,
                            timeout=60, check=True)
    listed = {line.split()[1]: line.split(None, 2)[2] for line in result.stdout.splitlines()}
    assert sorted(listed) == sorted(phony), "a .PHONY target without a `## what it does`"
    assert all(description.strip() for description in listed.values())
