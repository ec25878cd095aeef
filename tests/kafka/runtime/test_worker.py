"""The worker's start-up: a problem the operator must fix stops it before it joins a group."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from context_assembler.kafka.runtime import worker as run
from context_assembler.observability import logs
from context_assembler.settings import Settings


def worker(**settings: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASSEMBLER_BOOTSTRAP_SERVERS": "127.0.0.1:9",  # never contacted
           **{f"ASSEMBLER_{name.upper()}": value for name, value in settings.items()}}
    return subprocess.run([sys.executable, "-m", "context_assembler.cli", "worker"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_a_bad_policy_stops_the_worker_with_one_clear_line() -> None:
    result = worker(policy_file="no-such-policy")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and "no-such-policy" in entry["message"]
    assert "ASSEMBLER_POLICY_FILE" in entry["message"]


def test_a_policy_typo_names_the_setting_the_key_and_the_closest_valid_key(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text("[dedup]\nnear_treshold = 0.8\n")
    result = worker(policy_file=str(policy))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    message = json.loads(line)["message"]
    assert message.startswith("cannot start: ASSEMBLER_POLICY_FILE")
    assert message.endswith("dedup.near_treshold: unknown key in section [dedup]; did you mean "
                            "'near_threshold'?")


@pytest.mark.parametrize(("settings", "culprit"), [
    ({"policy_file": "no-such-policy"}, "ASSEMBLER_POLICY_FILE"),
    ({"policy_file": "window-8k", "allowed_policies": ("no-such-policy",)},
     "ASSEMBLER_ALLOWED_POLICIES"),
    ({"allowed_policies": ("estimated",)}, "ASSEMBLER_ALLOWED_POLICIES"),  # counts by estimate
    ({"policy_file": "window-8k", "allowed_policies": ("window-8k",)},  # the service's name
     "ASSEMBLER_ALLOWED_POLICIES"),
], ids=["policy-file", "allowed-missing", "allowed-estimator", "allowed-clash"])
def test_a_bad_policy_names_only_the_variable_that_holds_it(
    settings: dict[str, Any], culprit: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(logs, "configure", lambda level: None)  # keep pytest's log capture
    monkeypatch.setattr(run, "EventRunner", None)  # joining would call it: it must not be reached
    assert run.run_worker(Settings(**settings)) == 2
    (message,) = caplog.messages
    assert message.startswith(f"cannot start: {culprit}: ")
    other = ({"ASSEMBLER_POLICY_FILE", "ASSEMBLER_ALLOWED_POLICIES"} - {culprit}).pop()
    assert other not in message


def test_a_port_in_use_stops_the_worker_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = worker(http_port=str(port))
    assert result.returncode == 2
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert [e["level"] for e in entries] == ["INFO", "ERROR", "INFO"]  # starting, why, stopped
    assert entries[1]["message"] == (
        f"cannot start: 127.0.0.1:{port} (ASSEMBLER_HTTP_HOST:ASSEMBLER_HTTP_PORT) is in use "
        "(another worker on this machine?); set ASSEMBLER_HTTP_PORT to a free port, or 0 for any")
    assert entries[-1]["message"] == "stopped"


def test_a_broker_that_does_not_answer_is_one_line_naming_the_setting() -> None:
    """Not the client's own ERROR every 1-5 s besides: one line, until SIGTERM stops it."""
    env = {**os.environ, "ASSEMBLER_BOOTSTRAP_SERVERS": "127.0.0.1:9", "ASSEMBLER_HTTP_PORT": "0"}
    process = subprocess.Popen([sys.executable, "-m", "context_assembler.cli", "worker"], env=env,
                               stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    try:
        lines = [process.stderr.readline(), process.stderr.readline()]  # starting, why
        time.sleep(6)  # several of the client's reconnection attempts
    finally:
        process.terminate()
        _, rest = process.communicate(timeout=30)
    assert process.returncode == 0
    entries = [json.loads(line) for line in [*lines, *rest.splitlines()]]
    assert [(e["level"], e["logger"]) for e in entries] == [
        ("INFO", "context_assembler.kafka.runtime.worker"), ("ERROR", "context_assembler.kafka.tools.policies_topic"), ("INFO", "context_assembler.kafka.runtime.worker")]
    assert entries[0]["message"].startswith("starting on 127.0.0.1:9: ")
    assert "cannot reach the Kafka broker at 127.0.0.1:9" in entries[1]["message"]
    assert "ASSEMBLER_BOOTSTRAP_SERVERS" in entries[1]["message"]
    assert entries[2]["message"] == "stopped"
