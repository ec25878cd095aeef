"""Re-drive over an in-memory DLQ: what is sent back, what is skipped, and the count that
stops a record failing forever.

Against a real worker and broker: tests/integration/test_redrive.py.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import pytest
from aiokafka.structs import RecordMetadata

from context_assembler.contract.models import RejectReason
from context_assembler.intake.codec import RejectedInput
from context_assembler.intake.policy_registry import build_registry
from context_assembler.kafka import clients
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import (
    ERR,
    TRUNCATED,
    HandlerContext,
    Origin,
    SkippedBatch,
    cut,
    dead_letter,
    handle,
    header,
)
from context_assembler.kafka.tools import redrive as module
from context_assembler.kafka.tools.redrive import REDRIVES, RedriveRequest, letter_of, redrive
from context_assembler.settings import Settings
from harness.worker import events
from tests.factories import naming_policy
from tests.kafka.tools.replay.fakes import FakeReader, Topics

WORKER = HandlerContext(
    settings=Settings(input_topic="in", prompts_topic="p", audit_topic="a", dlq_topic="d"),
    registry=build_registry(None))  # no policy allowed: a request naming one is rejected
GOOD = events(8)
NAMING = [naming_policy(GOOD[-1], "window-8k")]  # a follow-up naming a preset
BAD = b'{"request_id": "bad-1", "chunks": 3}'


class Producer:
    made: ClassVar[list[Producer]] = []

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.sent: list[tuple[str, bytes, bytes | None, list[tuple[str, bytes]]]] = []
        Producer.made.append(self)

    async def start(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, *, key: bytes | None,
                   headers: list[tuple[str, bytes]]) -> asyncio.Future[RecordMetadata]:
        self.sent.append((topic, value, key, headers))
        done: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        done.set_result(RecordMetadata(topic, 0, None, len(self.sent) + 99, -1, 0, -1))
        return done

    async def stop(self) -> None:
        pass


def reject(topics: Topics, raw: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> None:
    """`raw` into "in" and, as the worker handles it, its dead letter into "d"."""
    topics.append("in", 0, raw, key=b"k", headers=headers)
    origin = Origin.from_record(topics.partition("in", 0)[-1])
    (letter,) = handle(raw, origin, WORKER).records
    assert letter.topic == "d"
    topics.append("d", 0, letter.value, key=letter.key, headers=letter.headers)


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> Topics:
    topics = Topics()
    for raw in [*NAMING, BAD]:
        reject(topics, raw, (("traceparent", b"00-abc-def-01"),))
    monkeypatch.setattr(module, "TopicReader", lambda clients: FakeReader(topics))

    async def exists(clients: KafkaClients, topic: str) -> None:
        pass

    monkeypatch.setattr(module, "check_topic", exists)
    Producer.made = []
    monkeypatch.setattr(clients, "AIOKafkaProducer", Producer)
    return topics


def request(**fields: Any) -> RedriveRequest:
    settings = Settings(bootstrap_servers="fake:9092", dlq_topic="d", input_topic="in")
    return RedriveRequest(settings, **fields)


def test_a_dry_run_groups_by_reason_and_sends_nothing(topics: Topics) -> None:
    report = asyncio.run(redrive(request()))
    assert {reason: len(letters) for reason, letters in report.groups.items()} == {
        "RejectedInput.policy": len(NAMING), "RejectedInput.schema": 1}
    assert Producer.made == []
    lines = report.render("in", 3)
    assert lines[0] == f"would re-drive {len(NAMING)}  RejectedInput.policy"
    assert lines[-1] == (f"would re-drive {len(NAMING) + 1} dead letters to in (dry run: --yes "
                         f"sends them); next run: --from 0:{len(NAMING) + 1}")


def test_yes_sends_the_original_key_value_and_headers_with_a_count(topics: Topics) -> None:
    report = asyncio.run(redrive(request(send=True, starts=[(0, 0)], count=2)))
    (producer,) = Producer.made
    assert producer.config["acks"] == "all" and producer.config["enable_idempotence"]
    originals = topics.partition("in", 0)[:2]
    assert [(t, v, k) for t, v, k, _ in producer.sent] == [
        ("in", r.value, r.key) for r in originals]
    assert [h for _, _, _, h in producer.sent] == [
        [("traceparent", b"00-abc-def-01"), (REDRIVES, b"1")]] * 2
    assert report.render("in", 3)[-1].startswith("re-drove 2 dead letters to in; next run")
    assert report.resent == [(0, 100), (0, 101)], "where they landed: what --wait waits for"


def test_a_record_failing_again_carries_its_count_and_stops_at_the_maximum(
    topics: Topics,
) -> None:
    raw, start = NAMING[0], 0
    for count in (1, 2, 3):  # re-driven, and rejected again by the worker each time
        asyncio.run(redrive(request(send=True, starts=[(0, start)], count=1)))
        (_, value, _, headers) = Producer.made[-1].sent[-1]
        assert value == raw and (REDRIVES, str(count).encode()) in headers
        reject(topics, raw, tuple(headers))
        start = topics.partition("d", 0)[-1].offset
        assert header(topics.partition("d", 0)[-1].headers, REDRIVES) == str(count).encode()
    last = topics.partition("d", 0)[-1].offset
    report = asyncio.run(redrive(request(send=True, starts=[(0, last)])))
    assert Producer.made[-1].sent == []
    assert [letter.redrives for letter in report.at_maximum] == [3]
    assert "skipped: re-driven 3 times already: 1" in report.render("in", 3)


def test_a_dead_letter_cut_to_fit_is_skipped(topics: Topics) -> None:
    origin = Origin("in", 0, 9, b"big", (), None)
    rejected = RejectedInput(RejectReason.SCHEMA, "not an event", "big")
    letter = cut(dead_letter(origin, b"x" * 40_000, rejected, "d", "w"), 20_000)
    assert header(letter.headers, TRUNCATED) == b"true"
    topics.append("d", 0, letter.value, key=letter.key, headers=letter.headers)
    report = asyncio.run(redrive(request(send=True)))
    assert [str(x.origin) for x in report.truncated] == [f"d/0/{len(NAMING) + 1}"]
    sent = Producer.made[0].sent
    assert len(sent) == len(NAMING) + 1 and letter.value not in {v for _, v, _, _ in sent}
    assert not any(k.startswith(ERR) for _, _, _, h in sent for k, _ in h)


def test_a_record_batch_skipped_unread_is_reported_and_never_sent(topics: Topics) -> None:
    skipped = SkippedBatch(first_offset=3, last_offset=3, codec="lz4", compressed_bytes=1_100_000,
                           limit=1 << 25, declared=None)
    offset = topics.append("d", 0, skipped)
    report = asyncio.run(redrive(request(send=True)))
    assert [str(x.origin) for x in report.unread] == [f"d/0/{offset}"]
    assert len(Producer.made[0].sent) == len(NAMING) + 1  # the others are re-driven
    lines = report.render("in", 3)
    assert "skipped: not read, its record batch is too large decompressed: 1" in lines
    assert f"    d/0/{offset}    {skipped.message}" in lines


def test_an_unreadable_count_is_taken_as_at_the_maximum() -> None:
    origin = Origin("d", 0, 0, None, ((REDRIVES, b"lots"),), None)
    assert letter_of(origin).redrives >= 1 << 30


@pytest.mark.parametrize("count", [b"-1000000", b"-1", b"+1", b" 2", b"2 ", b"1_0", b"\xd9\xa1",
                                   b"0x1", b"1" * 10, b"", b"\xff"])
def test_a_count_that_is_not_a_plain_decimal_is_taken_as_at_the_maximum(count: bytes) -> None:
    origin = Origin("d", 0, 0, None, ((REDRIVES, count),), None)
    assert letter_of(origin).redrives >= 1 << 30


def test_plain_decimal_counts_and_no_count_are_read_as_they_are() -> None:
    for count, expected in ((b"0", 0), (b"2", 2), (b"007", 7), (b"999999999", 999_999_999)):
        assert letter_of(Origin("d", 0, 0, None, ((REDRIVES, count),), None)).redrives == expected
    assert letter_of(Origin("d", 0, 0, None, (), None)).redrives == 0


def test_a_forged_negative_count_is_skipped_by_max_redrives(topics: Topics) -> None:
    reject(topics, BAD, ((REDRIVES, b"-1000000"),))
    report = asyncio.run(redrive(request(max_redrives=3)))
    assert [str(x.origin) for x in report.at_maximum] == [f"d/0/{len(NAMING) + 1}"]
