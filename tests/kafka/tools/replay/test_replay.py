"""Replay's orchestration over in-memory topics: what is read, written, sent and compared.

The broker-facing parts (a real worker's outputs, group offsets untouched, the CLI) are in
tests/integration/test_replay.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.intake.policy_registry import build_registry
from context_assembler.kafka import clients
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import ERR, HandlerContext, Origin, handle, value_of
from context_assembler.kafka.tools.reader import RangeError
from context_assembler.kafka.tools.replay import replay as module
from context_assembler.kafka.tools.replay.replay import (
    NotRecorded,
    ReplayRequest,
    find_recorded,
    replay,
)
from context_assembler.settings import Settings
from harness.worker import ALLOWED_POLICIES, events, file_mode
from tests.kafka.tools.replay.fakes import FakeReader, Topics

T = 1_764_547_200_000
REGISTRY = build_registry(None, ALLOWED_POLICIES)
GOOD = events(6)
BAD = b'{"request_id": "bad-1", "chunks": 3}'


def published_topics(*, publish: bool = True) -> Topics:
    """Input "in" (partition 0: three events and a bad one; partition 1: three events), and
    what the worker published for them on "p" (prompts), "a" (audits) and "d" (DLQ)."""
    topics = Topics()
    worker = HandlerContext(
        settings=Settings(input_topic="in", prompts_topic="p", audit_topic="a", dlq_topic="d"),
        registry=REGISTRY)
    inputs = [(0, GOOD[0]), (0, GOOD[1]), (0, GOOD[2]), (0, BAD),
              (1, GOOD[3]), (1, GOOD[4]), (1, GOOD[5])]
    for n, (partition, raw) in enumerate(inputs):
        stamp = T + n * 1000
        offset = topics.append("in", partition, raw, timestamp=stamp)
        found = topics.partition("in", partition)[-1]
        for out in handle(raw, Origin.from_record(found), worker).records:
            if publish or out.topic == "d":
                topics.append(out.topic, 0, out.value, key=out.key, headers=out.headers,
                              timestamp=stamp)
        assert found.offset == offset
    for topic in ("p", "a", "d"):
        topics.partition(topic, 0)
    return topics


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> Topics:
    topics = published_topics()
    monkeypatch.setattr(module, "TopicReader", lambda clients: FakeReader(topics))
    return topics


def request(**fields: Any) -> ReplayRequest:
    fields = {"registry": REGISTRY, **fields}
    settings = Settings(bootstrap_servers="fake:9092", input_topic="in", prompts_topic="p",
                        audit_topic="a")
    return ReplayRequest(settings, **fields)


def run(replay_request: ReplayRequest, stop: asyncio.Event | None = None) -> module.ReplayReport:
    return asyncio.run(replay(replay_request, stop or asyncio.Event()))


def by_id(path: Path) -> dict[str, bytes]:
    return {json.loads(line)["request_id"]: line for line in path.read_bytes().splitlines()}


def test_a_replay_writes_the_file_modes_bytes_and_finds_them_identical(
    topics: Topics, tmp_path: Path
) -> None:
    out, audit, errors = tmp_path / "p.jsonl", tmp_path / "a.jsonl", tmp_path / "e.jsonl"
    report = run(request(out=out, audit_out=audit, errors_out=errors, compare=True))
    assert [r.coordinates for r in report.replayed] == [
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)]
    assert (by_id(out), by_id(audit)) == file_mode(GOOD)
    (error,) = map(json.loads, errors.read_bytes().splitlines())
    assert (error["origin"], error["reason"], error["request_id"]) == ("in/0/3", "schema", "bad-1")
    assert report.replayed[3].result == f"schema: {error['message']}"
    statuses = [(c.origin, c.status) for c in report.comparisons]
    assert statuses == [(f"in/{p}/{o}", "identical") for p, o in (r.coordinates for r in report.replayed)]
    assert report.comparisons[3].lines == [f"rejected again: {report.replayed[3].result}"]
    assert not report.interrupted


def test_count_and_ranges_bound_the_replay(topics: Topics) -> None:
    assert len(run(request(count=2)).replayed) == 2
    by_time = run(request(from_ms=T + 4000))
    assert [r.coordinates for r in by_time.replayed] == [(1, 0), (1, 1), (1, 2)]
    by_offset = run(request(starts=[(0, 1)], ends=[(0, 3)]))
    assert [r.coordinates for r in by_offset.replayed] == [(0, 1), (0, 2)]


@pytest.mark.parametrize(("fields", "asked"), [
    ({"from_ms": T + 60_000}, "from 2025-12-01T00:01:00.000Z to the last record"),
    ({"from_ms": T - 60_000, "to_ms": T - 1}, "from 2025-11-30T23:59:00.000Z to "
     "2025-11-30T23:59:59.999Z"),
    ({"starts": [(0, 4)]}, "from 0:4 to the last record"),
])
def test_an_empty_range_says_which_range_and_where_the_records_are(
    topics: Topics, tmp_path: Path, fields: dict[str, Any], asked: str
) -> None:
    with pytest.raises(RangeError) as raised:
        run(request(out=tmp_path / "p.jsonl", **fields))
    assert str(raised.value) == (f"nothing to replay: no event on in {asked}; its records run "
                                 "from 2025-12-01T00:00:00.000Z to 2025-12-01T00:00:06.000Z")
    assert list(tmp_path.iterdir()) == []


def test_a_stopped_replay_keeps_what_it_replayed(topics: Topics, tmp_path: Path) -> None:
    stop = asyncio.Event()
    stop.set()  # Ctrl-C before the first event: that event is still finished
    report = run(request(out=tmp_path / "p.jsonl"), stop)
    assert report.interrupted and len(report.replayed) == 1
    assert len((tmp_path / "p.jsonl").read_bytes().splitlines()) == 1


def test_a_failed_replay_writes_nothing(
    topics: Topics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, "TopicReader", lambda clients: FakeReader(topics, fail_after=3))
    with pytest.raises(ConnectionError):
        run(request(out=tmp_path / "p.jsonl", audit_out=tmp_path / "a.jsonl"))
    assert list(tmp_path.iterdir()) == []


def test_a_changed_policy_is_reported_as_different(topics: Topics, tmp_path: Path) -> None:
    tight = tmp_path / "tight.toml"
    tight.write_text("[budget]\ncontext_tokens = 300\n")
    report = run(request(registry=build_registry(str(tight), ALLOWED_POLICIES), compare=True,
                         starts=[(0, 0)], count=1))
    (comparison,) = report.comparisons
    assert comparison.status == "different"
    assert any(line.startswith("policy: default sha256:") for line in comparison.lines)


def test_unpublished_inputs_are_reported_so(monkeypatch: pytest.MonkeyPatch) -> None:
    topics = published_topics(publish=False)
    monkeypatch.setattr(module, "TopicReader", lambda clients: FakeReader(topics))
    report = run(request(compare=True))
    statuses = [c.status for c in report.comparisons]
    assert statuses == ["not published"] * 3 + ["identical"] + ["not published"] * 3


class Producer:
    """AIOKafkaProducer as replay uses it: one transaction."""

    made: ClassVar[list[Producer]] = []

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.calls: list[str] = []
        self.sent: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []
        Producer.made.append(self)

    async def start(self) -> None:
        self.calls.append("start")

    async def begin_transaction(self) -> None:
        self.calls.append("begin")

    async def send(self, topic: str, value: bytes, *, key: bytes | None,
                   headers: list[tuple[str, bytes]]) -> None:
        self.sent.append((topic, value, key, headers))

    async def commit_transaction(self) -> None:
        self.calls.append("commit")

    async def abort_transaction(self) -> None:
        self.calls.append("abort")

    async def stop(self) -> None:
        self.calls.append("stop")


@pytest.fixture
def producers(monkeypatch: pytest.MonkeyPatch) -> list[Producer]:
    Producer.made = []
    monkeypatch.setattr(clients, "AIOKafkaProducer", Producer)
    return Producer.made


def test_replay_into_a_topic_is_one_transaction(topics: Topics, producers: list[Producer]) -> None:
    run(request(to_topic="replayed", starts=[(0, 0)]))
    (producer,) = producers
    assert producer.calls == ["start", "begin", "commit", "stop"]
    assert producer.config["transactional_id"].startswith("context-assembler-replay-")
    prompts = {value for topic, value, _, _ in producer.sent if topic == "replayed"}
    audits = {value for topic, value, _, _ in producer.sent if topic == "replayed.audit"}
    assert prompts == {r.value for r in topics.partition("p", 0)[:3]}  # the bad one: not sent
    assert audits == {r.value for r in topics.partition("a", 0)[:3]}
    headers = dict(producer.sent[0][3])
    assert headers["context-assembler.source.offset"] == b"0"
    assert not any(name.startswith(ERR) for _, _, _, h in producer.sent for name, _ in h)

    run(request(to_topic="replayed", to_audit_topic="audits", count=1))
    assert {topic for topic, _, _, _ in producers[1].sent} == {"replayed", "audits"}


def test_a_failed_replay_into_a_topic_is_aborted(
    topics: Topics, producers: list[Producer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(module, "TopicReader", lambda clients: FakeReader(topics, fail_after=2))
    with pytest.raises(ConnectionError):
        run(request(to_topic="replayed"))
    assert producers[0].calls == ["start", "begin", "abort", "stop"]


def test_explain_finds_the_latest_audit_and_its_input(topics: Topics) -> None:
    request_id = json.loads(GOOD[4])["request_id"]
    raw, audit, origin = asyncio.run(find_recorded(KafkaClients("fake:9092"), "a", request_id, None))
    assert (raw, origin) == (GOOD[4], "in/1/1")
    assert json.loads(audit)["request_id"] == request_id

    recorded = topics.partition("a", 0)[4]
    newer = replace(recorded, offset=99, value=b"newer")
    topics.partition("a", 0).append(newer)
    assert asyncio.run(find_recorded(KafkaClients("fake:9092"), "a", request_id, None))[1] == b"newer"


def test_explain_says_what_is_not_recorded(topics: Topics) -> None:
    def find(request_id: str) -> str:
        with pytest.raises(NotRecorded) as caught:
            asyncio.run(find_recorded(KafkaClients("fake:9092"), "a", request_id, None))
        assert isinstance(caught.value, ContextAssemblerError | LookupError)
        return str(caught.value)

    assert find("nobody") == "no audit for request 'nobody' on a"
    sourceless = replace(topics.partition("a", 0)[0], offset=100, key=b"lost", headers=[])
    topics.partition("a", 0).append(sourceless)
    assert find("lost") == "the audit of 'lost' does not say where its input came from"
    del topics.partition("in", 1)[1]
    request_id = json.loads(GOOD[4])["request_id"]
    assert find(request_id) == "the input in/1/1 is no longer stored"
    assert value_of(topics.partition("in", 1)[0]) == GOOD[3]
