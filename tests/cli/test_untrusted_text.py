"""Every command that prints text from events or records prints it escaped.

One hostile string (ESC/CSI, OSC 52, BEL, C1 controls, bidi overrides and isolates, the
Unicode line and paragraph separators, DEL, NUL) goes into every field an event or a record
carries; each command is run as an operator runs it, over files or in-memory topics, and
nothing of that string may reach stdout or stderr unescaped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from context_assembler.cli.main import main
from context_assembler.intake.policy_registry import build_registry
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import HandlerContext, Origin, handle
from context_assembler.kafka.tools import policies_topic as policies_module
from context_assembler.kafka.tools import produce as produce_module
from context_assembler.kafka.tools import reader as reader_module
from context_assembler.kafka.tools import redrive as redrive_module
from context_assembler.kafka.tools.replay import replay as replay_module
from context_assembler.settings import Settings
from tests.kafka.tools.replay.fakes import FakeReader, Topics

HOSTILE = ("\x1b[2J\x1b]52;c;b3duZWQ=\x07\x9b31m\x9d0;title\x9c\u202eevil\u202c\u2066"
           "\u061c\u200f\u2028\u2029\x85\x7f\x00\x0b\x0c\r")
# What no terminal may receive: C0 (but the line feed and tab of our own layout) and C1
# controls, DEL, bidi controls, line and paragraph separators.
UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
TOPICS = {"INPUT": "in", "PROMPTS": "p", "AUDIT": "a", "DLQ": "d"}


def hostile_event(request_id: str) -> bytes:
    """An event that assembles, every free-text field of it hostile: one chunk kept, one
    dropped for its audience (the drop's detail quotes the audience names)."""
    return json.dumps({
        "request_id": request_id,
        "question": f"what {HOSTILE}?",
        "audience": f"staff{HOSTILE}",
        "history": [{"role": "user", "content": f"before {HOSTILE}"}],
        "metadata": {HOSTILE: HOSTILE},
        "chunks": [
            {"chunk_id": "a", "doc_id": f"d{HOSTILE}", "title": f"t{HOSTILE}",
             "text": f"kept text {HOSTILE} more\n{HOSTILE}", "source": HOSTILE},
            {"chunk_id": "b", "doc_id": f"e{HOSTILE}", "text": f"secret {HOSTILE}",
             "audience": [f"hr{HOSTILE}"]},
        ],
    }).encode()


GOOD_ID = f"r{HOSTILE}"
EVENT = hostile_event(GOOD_ID)
# Rejected: its dead letter or error record quotes the request id and the message.
BAD = json.dumps({"request_id": f"bad{HOSTILE}", "question": HOSTILE, "chunks": 3}).encode()
WORKER = HandlerContext(
    settings=Settings(input_topic="in", prompts_topic="p", audit_topic="a", dlq_topic="d"),
    registry=build_registry(None))


def published() -> Topics:
    """The hostile events on "in", and what the worker publishes for them on p, a and d."""
    topics = Topics()
    for raw in (EVENT, BAD):
        topics.append("in", 0, raw, key=GOOD_ID.encode(), headers=((HOSTILE, HOSTILE.encode()),))
        for out in handle(raw, Origin.from_record(topics.partition("in", 0)[-1]),
                          WORKER).records:
            topics.append(out.topic, 0, out.value, key=out.key, headers=out.headers)
    for topic in ("p", "a", "d"):
        topics.partition(topic, 0)
    # A record that is not what its topic holds, from whoever may write to the topic.
    topics.append("p", 0, HOSTILE.encode(), key=HOSTILE.encode())
    return topics


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> Topics:
    """In-memory topics behind every Kafka command's reader, admin check and producer."""
    topics = published()
    for name, topic in TOPICS.items():
        monkeypatch.setenv(f"ASSEMBLER_{name}_TOPIC", topic)

    def fake_reader(clients: KafkaClients) -> FakeReader:
        return FakeReader(topics)

    for module in (replay_module, redrive_module, policies_module, reader_module):
        monkeypatch.setattr(module, "TopicReader", fake_reader)

    async def exists(clients: KafkaClients, topic: str) -> None:
        pass

    monkeypatch.setattr(redrive_module, "check_topic", exists)

    async def produce(clients: KafkaClients, topic: str, lines: Iterable[bytes]
                      ) -> list[tuple[int, int]]:
        """Each line onto `topic`, and at once its dead letter, as a worker would answer."""
        sent = []
        for line in lines:
            offset = topics.append(topic, 0, line, key=GOOD_ID.encode())
            origin = Origin.from_record(topics.partition(topic, 0)[-1])
            for out in handle(BAD, origin, WORKER).records:
                topics.append(out.topic, 0, out.value, key=out.key, headers=out.headers)
            sent.append((0, offset))
        return sent

    monkeypatch.setattr(produce_module, "produce", produce)
    return topics


def _files(tmp_path: Path) -> Path:
    events = tmp_path / "events.jsonl"
    events.write_bytes(EVENT + b"\n" + BAD + b"\n" + b'{"request_id": "x", "' + HOSTILE.encode()
                       + b'": 1}\n')
    return events


def _tight(tmp_path: Path) -> str:
    """A policy under which the published prompts differ: a replay prints a comparison."""
    policy = tmp_path / "tight.toml"
    policy.write_text("[budget]\ncontext_tokens = 1\n")
    return str(policy)


# Each command that prints what an event or a record says, as an operator runs it.
COMMANDS: dict[str, Callable[[Path], list[str]]] = {
    "assemble": lambda tmp: ["assemble", str(_files(tmp)), "--out", str(tmp / "o.jsonl")],
    "explain": lambda tmp: ["explain", "--events", str(_files(tmp))],
    "explain one request": lambda tmp: ["explain", GOOD_ID, "--events", str(_files(tmp))],
    "explain a request not there": lambda tmp: ["explain", f"no{HOSTILE}", "--events",
                                                str(_files(tmp))],
    "explain --audit": lambda tmp: ["explain", "--events", str(_files(tmp)), "--audit",
                                    str(_audits(tmp))],
    "sweep": lambda tmp: ["sweep", "--events", str(_files(tmp)), "--budgets", "10,500"],
    "explain --kafka": lambda tmp: ["explain", GOOD_ID, "--kafka"],
    "tail prompts": lambda tmp: ["tail", "prompts"],
    "tail audit": lambda tmp: ["tail", "audit"],
    "tail dlq": lambda tmp: ["tail", "dlq"],
    "produce --wait": lambda tmp: ["produce", str(_files(tmp)), "--wait", "--timeout", "5",
                                  ],
    "replay --compare": lambda tmp: ["replay", "--compare", "--verbose"],
    "replay --compare under another policy": lambda tmp: [
        "replay", "--compare", "--policy", _tight(tmp)],
    "redrive": lambda tmp: ["redrive"],
}


def _audits(tmp_path: Path) -> Path:
    audits = tmp_path / "audits.jsonl"
    assert main(["assemble", str(_files(tmp_path)), "--out", str(tmp_path / "p.jsonl"),
                 "--audit", str(audits), "--errors", str(tmp_path / "e.jsonl")]) == 1
    return audits


@pytest.mark.parametrize("name", COMMANDS)
def test_no_command_prints_an_events_control_or_bidi_characters_raw(
    name: str, topics: Topics, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = COMMANDS[name](tmp_path)
    capsys.readouterr()
    status = main(argv)
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert status in (0, 1, 2), shown
    assert "this is a bug" not in shown
    assert captured.out or captured.err  # something was printed, and checked
    raw = sorted({f"U+{ord(c):04X}" for c in UNSAFE.findall(shown)})
    assert raw == [], f"{name} printed {raw} raw:\n{shown}"
    assert "\\x1b" in shown or "\\u001b" in shown  # the hostile text was shown, escaped
