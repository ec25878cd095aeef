"""The Kafka commands' broker-free parts: what they refuse before connecting, which policy
explain --kafka shows, and that the file commands never load a Kafka client."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from context_assembler.cli import kafka
from context_assembler.cli.main import main
from context_assembler.intake.policy_registry import build_registry, load_preset
from context_assembler.kafka.tools.replay import replay
from tests.factories import EXAMPLES


def test_replay_refuses_one_file_for_two_outputs_before_connecting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out.jsonl")
    assert main(["replay", "--from", "0:0", "--out", out, "--errors", out]) == 2
    assert "--errors" in capsys.readouterr().err and not os.listdir(tmp_path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replay", "--from", "0:0", "--from-time", "2026-11-29T16:00:00Z"],
         "give --from or --from-time, not both"),
        (["replay", "--from", "zero"], "'zero': expected PARTITION:OFFSET"),
        (["replay", "--from-time", "yesterday"], "'yesterday': expected an ISO-8601 time"),
        (["explain", "--kafka"], "explain --kafka needs a REQUEST_ID"),
    ],
)
def test_usage_errors_are_refused_before_connecting(
        args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert capsys.readouterr().err.startswith(f"context-assembler: {message}")


def test_explain_kafka_says_what_is_not_recorded(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    async def nothing_recorded(clients: object, topic: str, request_id: str,
                               from_ms: int | None) -> None:
        raise replay.NotRecorded(f"no audit for request {request_id!r} on {topic}")

    monkeypatch.setattr(replay, "find_recorded", nothing_recorded)
    assert main(["explain", "nobody", "--kafka", "--audit-topic", "audits"]) == 2
    assert capsys.readouterr().err == "context-assembler: no audit for request 'nobody' on audits\n"


def test_explain_kafka_shows_the_recorded_policy_the_operator_chooses() -> None:
    registry = build_registry("estimated", ["window-8k"])
    allowed = kafka.recorded_policy(registry, "window-8k")
    assert allowed is registry.resolve("window-8k") and allowed.guard == registry.default.guard
    assert kafka.recorded_policy(registry, "rank-fidelity") == load_preset("rank-fidelity")
    assert kafka.recorded_policy(registry, "gone") is registry.default


def test_the_file_commands_never_load_a_kafka_client(tmp_path: Path) -> None:
    events = EXAMPLES / "events.jsonl"
    script = (
        "import sys\n"
        "from context_assembler.cli.main import main\n"
        f"assert main(['assemble', {str(events)!r}, '--out', {os.devnull!r},"
        " '--allow-policy', 'window-8k']) == 0\n"
        f"assert main(['explain', 'q30-staff', '--events', {str(events)!r}]) == 0\n"
        f"assert main(['sweep', 'q30-staff', '--events', {str(events)!r}, '--budgets', '300',"
        f" '--png', {str(tmp_path / 's.png')!r}]) == 0\n"
        "assert main(['policy']) == 0\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'aiokafka', 'faust', 'kafka'})\n"
        "loaded += sorted(m for m in sys.modules if m.startswith('context_assembler.kafka'))\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "[]"


def test_produce_leaves_out_a_line_no_topic_could_take_naming_it_and_sends_the_rest() -> None:
    """A line over the largest record is never held whole: it is named, not sent."""
    huge = b'{"request_id": "big", "question": "' + b"x" * 50_000 + b'"}\n'
    stream = io.BytesIO(b'{"request_id": "a"}\n' + huge + b"\n  \n" + b'{"request_id": "b"}\r\n')
    skipped: list[str] = []
    sent = list(kafka.producible([("events.jsonl", stream)], 1_000, skipped))
    assert sent == [b'{"request_id": "a"}', b'{"request_id": "b"}']
    assert skipped == [f"events.jsonl:2: not sent, the line is {len(huge) - 1} bytes, over "
                       "ASSEMBLER_MAX_MESSAGE_BYTES (--max-message-bytes) = 1000"]
