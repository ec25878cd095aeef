"""The harness's process bookkeeping, on a short Python process instead of a JVM."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.jvm import Jvm

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)  # harness-test-sleeper"]


def test_a_started_process_runs_until_stopped_and_its_pid_file_goes(tmp_path: Path) -> None:
    process = Jvm(tmp_path, "sleeper", "harness-test-sleeper")
    process.launch(SLEEPER)
    assert process.running()  # at once: no wait for its command line to show
    pid = process.pid
    process.stop()
    assert not process.running()
    assert not process.pidfile.exists()
    assert not Path(f"/proc/{pid}").exists()  # reaped, not left a zombie


def test_a_pid_file_naming_another_program_is_not_taken_for_ours(tmp_path: Path) -> None:
    """A pid reused by another program after a reboot or a crash is not ours to signal."""
    (tmp_path / "broker.pid").write_text(f"{os.getpid()}\n")  # this pytest, alive
    assert not Jvm(tmp_path, "broker", "kafka.Kafka").running()
    Jvm(tmp_path, "broker", "kafka.Kafka").stop()  # signals nothing, forgets the pid
    assert not (tmp_path / "broker.pid").exists()
