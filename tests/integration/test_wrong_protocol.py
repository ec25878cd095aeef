"""A client configured for SASL, pointed at a PLAINTEXT listener (the project's own broker):
every Kafka command stops with one line naming the protocol setting, exit 2, never a bug."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.kafka import Broker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

COMMANDS = {
    "worker": ["worker"],
    "tail": ["tail", "prompts"],
    "produce": ["produce", "EVENTS"],
    "replay": ["replay"],
    "topics create": ["topics", "create"],
    "explain --kafka": ["explain", "r1", "--kafka"],
    "redrive": ["redrive"],
    "policy --diff": ["policy", "--diff", "a", "b"],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_sasl_client_at_a_plaintext_listener_exits_2_naming_the_protocol_setting(
    broker: Broker, tmp_path: Path, command: str,
) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"request_id": "r1", "question": "q"}\n')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ASSEMBLER_")},
           "ASSEMBLER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
           "ASSEMBLER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "ASSEMBLER_SASL_MECHANISM": "SCRAM-SHA-512",
           "ASSEMBLER_SASL_USERNAME": "assembler",
           "ASSEMBLER_SASL_PASSWORD": "pa55-word",
           "ASSEMBLER_HTTP_PORT": "0"}
    argv = [str(events) if word == "EVENTS" else word for word in COMMANDS[command]]
    done = subprocess.run([sys.executable, "-m", "context_assembler.cli", *argv], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    problems = [line for line in done.stderr.splitlines()
                if "ASSEMBLER_SECURITY_PROTOCOL" in line]
    assert len(problems) == 1, done.stderr
    assert "PLAINTEXT" in problems[0] and "SASL" in problems[0]
    assert "this is a bug" not in done.stderr and "Traceback" not in done.stderr
    assert "pa55-word" not in done.stdout + done.stderr
