"""Ranges: positions and times as the operator writes them, and spans checked against the
topic's bounds, without a broker."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.kafka.tools.reader import (
    RangeError,
    Span,
    TopicReader,
    is_position,
    parse_position,
    parse_time,
)
from tests.kafka.tools.replay.fakes import FakeReader, Topics, record


def test_positions_and_times_are_told_apart() -> None:
    assert is_position("0:1200") and is_position("12:0")
    for text in ("2026-11-29T17:30:00Z", "2026-11-29T17:30", "0:", ":5", "a:1", "0:1:2", "-1:5"):
        assert not is_position(text)


def test_a_position_is_partition_and_offset() -> None:
    assert parse_position("3:1187") == (3, 1187)
    for text in ("zero", "3", "3:x", "0:1:2"):
        with pytest.raises(RangeError, match=r"expected PARTITION:OFFSET, e\.g\. 0:1200"):
            parse_position(text)


def test_times_are_iso_8601_naive_ones_utc_and_exact_to_the_millisecond() -> None:
    when = datetime(2026, 11, 29, 17, 30, tzinfo=UTC)
    ms = int(when.timestamp()) * 1000
    assert parse_time("2026-11-29T17:30:00Z") == ms
    assert parse_time("2026-11-29T17:30:00") == ms
    assert parse_time("2026-11-29T18:30:00+01:00") == ms
    assert parse_time("2026-11-29") == ms - (17 * 60 + 30) * 60_000
    # Float seconds * 1000 would be 1 ms short for these.
    assert parse_time("2038-01-19T09:08:47.082Z") == 2_147_504_927_082
    assert parse_time("2026-11-29T17:30:00.001Z") == ms + 1
    assert parse_time("1970-01-01T00:00:00Z") == 0
    with pytest.raises(RangeError, match="before 1970-01-01"):  # no record is stamped then
        parse_time("1969-12-31T23:59:59.999Z")
    for text in ("yesterday", "2026-13-01", "17:30"):
        with pytest.raises(RangeError, match="expected an ISO-8601 time"):
            parse_time(text)


def test_range_errors_are_the_projects_errors() -> None:
    assert issubclass(RangeError, ContextAssemblerError) and issubclass(RangeError, ValueError)


# Spans: TopicReader.spans over an in-memory topic (partitions 0 and 1, offsets 0-9 and 0-4,
# one record a second from T).

T = 1_764_547_200_000


@pytest.fixture
def reader() -> FakeReader:
    topics = Topics()
    for partition, count in ((0, 10), (1, 5)):
        for n in range(count):
            topics.append("in", partition, b"{}", timestamp=T + n * 1000)
    return FakeReader(topics)


async def test_by_default_every_partition_from_its_first_offset_to_its_end(
    reader: FakeReader,
) -> None:
    assert await reader.spans("in") == [Span(0, 0, 10), Span(1, 0, 5)]


async def test_starts_choose_partitions_and_ends_stop_them(reader: FakeReader) -> None:
    assert await reader.spans("in", starts=[(1, 2)]) == [Span(1, 2, 5)]
    assert await reader.spans("in", starts=[(0, 3), (1, 0)], ends=[(0, 6)]) == [
        Span(0, 3, 6), Span(1, 0, 5)]
    assert await reader.spans("in", starts=[(0, 3)], ends=[(0, 1)]) == [Span(0, 3, 3)]  # empty
    assert await reader.spans("in", starts=[(0, 3)], ends=[(0, 99)]) == [Span(0, 3, 10)]
    with pytest.raises(RangeError, match="--to 1:3 names a partition without a start"):
        await reader.spans("in", starts=[(0, 3)], ends=[(1, 3)])


async def test_times_resolve_to_the_first_offset_at_or_after_them(reader: FakeReader) -> None:
    assert await reader.spans("in", from_ms=T + 3000) == [Span(0, 3, 10), Span(1, 3, 5)]
    assert await reader.spans("in", from_ms=T + 6000) == [Span(0, 6, 10), Span(1, 5, 5)]
    assert await reader.spans("in", from_ms=T + 1000, to_ms=T + 4000) == [
        Span(0, 1, 4), Span(1, 1, 4)]
    assert await reader.spans("in", from_ms=T, to_ms=T + 8000) == [Span(0, 0, 8), Span(1, 0, 5)]


@pytest.mark.parametrize(
    ("starts", "message"),
    [
        ([(9, 0)], "topic 'in' has no partition 9 (partitions: 0, 1)"),
        ([(0, 11)], "in/0: offset 11 is past the end (10)"),
        ([(1, 1)], "in/1: offset 1 is before the first offset still stored (2); "
                   "the range was deleted by retention or compaction"),
    ],
)
async def test_a_range_outside_the_topic_is_a_clear_error(
    reader: FakeReader, starts: list[tuple[int, int]], message: str
) -> None:
    reader.topics.first[("in", 1)] = 2
    with pytest.raises(RangeError) as caught:
        await reader.spans("in", starts=starts)
    assert str(caught.value) == message


async def test_an_unknown_topic_is_a_clear_error(reader: FakeReader) -> None:
    with pytest.raises(RangeError, match="topic 'nope' does not exist"):
        await reader.spans("nope")


# TopicReader.read, over a consumer that serves an in-memory partition.

class Consumer:
    """What `read` asks of AIOKafkaConsumer: assign, seek, getmany, position."""

    def __init__(self, records: dict[int, list[ConsumerRecord[bytes, bytes]]]) -> None:
        self.records = records
        self.positions: dict[TopicPartition, int] = {}

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.positions = {tp: 0 for tp in partitions}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        batch = {}
        for tp in partitions:
            ahead = [r for r in self.records[tp.partition] if r.offset >= self.positions[tp]][:2]
            if ahead:
                batch[tp] = ahead
                self.positions[tp] = ahead[-1].offset + 1
            else:  # at the end: past any trailing gap (a transaction marker)
                self.positions[tp] = self.records[tp.partition][-1].offset + 2
        return batch

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]


def reading(offsets: dict[int, Sequence[int]]) -> TopicReader:
    reader: Any = TopicReader.__new__(TopicReader)  # no client: its consumer is faked
    reader._consumer = Consumer(
        {p: [record("in", p, o, f"{p}:{o}".encode()) for o in found]
         for p, found in offsets.items()})
    return reader  # type: ignore[no-any-return]


async def read(reader: TopicReader, spans: list[Span]) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) async for r in reader.read("in", spans)]


async def test_read_yields_each_span_in_offset_order_across_gaps() -> None:
    reader = reading({0: [0, 1, 2, 4, 7, 8, 9], 1: [0, 1, 2]})
    found = await read(reader, [Span(0, 1, 8), Span(1, 2, 3), Span(1, 3, 3)])
    assert [o for p, o in found if p == 0] == [1, 2, 4, 7]
    assert [o for p, o in found if p == 1] == [2]


async def test_read_of_empty_spans_reads_nothing() -> None:
    assert await read(reading({0: [0, 1]}), [Span(0, 1, 1)]) == []


async def test_a_span_whose_first_offset_is_gone_is_an_error() -> None:
    with pytest.raises(RangeError, match=r"in/0: offset 3 no longer exists \(the next is 4\)"):
        await read(reading({0: [0, 1, 2, 4, 5]}), [Span(0, 3, 5)])
