"""Read a range of a topic without a consumer group: assign, seek, never commit.

Replay and explain use it; the worker's group and its committed offsets are never touched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiokafka import TopicPartition
from aiokafka.errors import NoError, UnsupportedCodecError
from aiokafka.structs import ConsumerRecord

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.kafka.batches import guard
from context_assembler.kafka.clients import (
    REFUSED_CONNECTION,
    KafkaClients,
)
from context_assembler.kafka.errors import answered
from context_assembler.kafka.tools.topics import refused
from context_assembler.kafka.tuning import FETCH_WAIT_MS, POLL_TIMEOUT_MS
from context_assembler.kafka.undecodable import Undecodable, undecodable

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


class RangeError(ContextAssemblerError, ValueError):
    """A range that cannot be read as asked: no such topic, partition or offset."""


@dataclass(frozen=True)
class Span:
    """Offsets [start, end) of one partition."""

    partition: int
    start: int
    end: int


def is_position(text: str) -> bool:
    """PARTITION:OFFSET (as opposed to an ISO-8601 time, which has colons too)."""
    partition, colon, offset = text.partition(":")
    return bool(colon) and partition.isdigit() and offset.isdigit()


def parse_position(text: str) -> tuple[int, int]:
    partition, _, offset = text.partition(":")
    try:
        return int(partition), int(offset)
    except ValueError:
        raise RangeError(f"{text!r}: expected PARTITION:OFFSET, e.g. 0:1200") from None


def parse_time(text: str) -> int:
    """ISO-8601 to epoch milliseconds (naive times are UTC)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RangeError(
            f"{text!r}: expected an ISO-8601 time, e.g. 2026-11-29T17:30:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if moment < _EPOCH:
        raise RangeError(f"{text!r} is before 1970-01-01T00:00:00Z, where Kafka's record "
                         "timestamps begin")
    return (moment - _EPOCH) // _MILLISECOND  # exact: float seconds * 1000 can fall 1 ms short


def iso(when_ms: int) -> str:
    """Epoch milliseconds as the ISO-8601 UTC time --from-time takes."""
    moment = _EPOCH + when_ms * _MILLISECOND
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe_range(
    starts: Sequence[tuple[int, int]], from_ms: int | None, ends: Sequence[tuple[int, int]],
    to_ms: int | None,
) -> str:
    """A range as its --from, --from-time and --to give it."""
    positions = ", ".join(f"{p}:{o}" for p, o in starts)
    begin = (f"from {positions}" if starts else f"from {iso(from_ms)}" if from_ms is not None
             else "from the first record")
    stops = [f"{p}:{o}" for p, o in ends] + ([iso(to_ms)] if to_ms is not None else [])
    return f"{begin} to {', '.join(stops) if stops else 'the last record'}"


class TopicReader:
    def __init__(self, clients: KafkaClients) -> None:
        guard()  # the bound the command set, else the default: never a batch decoded whole
        self._consumer = clients.consumer(
            group_id=None,  # no group: nothing to join, nothing committed
            auto_offset_reset="none",
            fetch_max_wait_ms=FETCH_WAIT_MS,
        )
        self._admin = clients.admin()
        self._clients = clients

    async def __aenter__(self) -> TopicReader:
        """Raises TopicError when the broker cannot be reached."""
        try:
            await self._admin.start()
        except REFUSED_CONNECTION:
            await self._consumer.stop()  # never started: only marks it closed
            await self._admin.close()
            raise await refused(self._clients) from None
        try:
            await self._consumer.start()
        except BaseException:
            await self._admin.close()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        try:
            await self._consumer.stop()
        finally:
            await self._admin.close()

    async def partitions(self, topic: str) -> list[int]:
        # Every topic, fresh: asking for one by name could have the broker create it.
        described = await self._admin.describe_topics()
        found = [
            part["partition"]
            for entry in described
            if entry["topic"] == topic and answered(entry, NoError)
            for part in entry["partitions"]
        ]
        if not found:
            raise RangeError(f"topic {topic!r} does not exist")
        return sorted(found)

    async def bounds(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        """First and end (next) offset of each partition, as the broker sees them now."""
        tps = [TopicPartition(topic, p) for p in partitions]
        first = await self._consumer.beginning_offsets(tps)
        end = await self._consumer.end_offsets(tps)
        return {tp.partition: (first[tp], end[tp]) for tp in tps}

    async def record_times(self, topic: str) -> tuple[int, int] | None:
        """The timestamps of the topic's first and last records still stored, or None when it
        holds none: what a range that found nothing can be compared with."""
        bounds = await self.bounds(topic, await self.partitions(topic))
        firsts = [Span(p, first, first + 1) for p, (first, end) in bounds.items() if end > first]
        # The last few: a partition's last offset may be a transaction marker, not a record.
        lasts = [Span(p, max(first, end - 3), end) for p, (first, end) in bounds.items()]
        first_times = [r.timestamp async for r in self.read(topic, firsts, compacted=True)]
        last_times = [r.timestamp async for r in self.read(topic, lasts, compacted=True)]
        if not first_times or not last_times:
            return None
        return min(first_times), max(last_times)

    async def offsets_at(
        self, topic: str, partitions: Sequence[int], when_ms: int
    ) -> dict[int, int | None]:
        """The first offset whose timestamp is >= when_ms (None: nothing that late)."""
        found = await self._consumer.offsets_for_times(
            {TopicPartition(topic, p): when_ms for p in partitions}
        )
        return {tp.partition: (None if hit is None else hit.offset) for tp, hit in found.items()}

    async def spans(
        self,
        topic: str,
        *,
        starts: Sequence[tuple[int, int]] = (),
        from_ms: int | None = None,
        ends: Sequence[tuple[int, int]] = (),
        to_ms: int | None = None,
    ) -> list[Span]:
        """Resolve --from/--from-time and --to/--to-time into checked offset spans."""
        partitions = await self.partitions(topic)
        bounds = await self.bounds(topic, partitions)
        if starts:
            chosen = {p: o for p, o in starts}
        elif from_ms is not None:
            at = await self.offsets_at(topic, partitions, from_ms)
            chosen = {p: (bounds[p][1] if o is None else o) for p, o in at.items()}
        else:
            chosen = {p: bounds[p][0] for p in partitions}
        unknown = sorted(set(chosen) - set(bounds))
        if unknown:
            raise RangeError(f"topic {topic!r} has no partition {unknown[0]} "
                             f"(partitions: {', '.join(map(str, partitions))})")
        stop = {p: bounds[p][1] for p in chosen}  # default: the end as of now
        if to_ms is not None:
            at = await self.offsets_at(topic, list(chosen), to_ms)
            stop = {p: (bounds[p][1] if o is None else o) for p, o in at.items()}
        for partition, offset in ends:
            if partition not in chosen:
                raise RangeError(f"--to {partition}:{offset} names a partition without a start")
            stop[partition] = offset
        spans = []
        for partition, start in sorted(chosen.items()):
            first, end = bounds[partition]
            if start < first:
                raise RangeError(
                    f"{topic}/{partition}: offset {start} is before the first offset still "
                    f"stored ({first}); the range was deleted by retention or compaction")
            if start > end:
                raise RangeError(f"{topic}/{partition}: offset {start} is past the end ({end})")
            spans.append(Span(partition, start, min(max(stop[partition], start), end)))
        return spans

    async def follow(self, starts: Mapping[TopicPartition, int]) -> AsyncIterator[ConsumerRecord]:
        """Records from `starts` on, as they arrive, until the caller stops reading."""
        self._consumer.assign(list(starts))
        for tp, offset in starts.items():
            self._consumer.seek(tp, offset)
        while True:
            batch = await self._consumer.getmany(timeout_ms=POLL_TIMEOUT_MS)
            for records in batch.values():
                for record in records:
                    yield record

    async def read(
        self, topic: str, spans: Sequence[Span], *, compacted: bool = False
    ) -> AsyncIterator[ConsumerRecord]:
        """Records of the spans, each partition in offset order, partitions interleaved.

        Offset gaps inside a span are normal (transaction markers, compaction); a span whose
        first offset no longer exists is an error, since the record asked for is gone, unless
        the whole of a `compacted` topic is read.
        """
        todo = {TopicPartition(topic, s.partition): s for s in spans if s.end > s.start}
        if not todo:
            return
        self._consumer.assign(list(todo))
        for tp, span in todo.items():
            self._consumer.seek(tp, span.start)
        started: set[TopicPartition] = set()
        while todo:
            try:
                batch = await self._consumer.getmany(*todo, timeout_ms=POLL_TIMEOUT_MS)
            except UnsupportedCodecError as error:
                raise Undecodable(undecodable(error, topic)) from None
            for tp, records in batch.items():
                if tp not in todo:
                    continue
                span = todo[tp]
                for record in records:
                    if record.offset >= span.end:
                        break
                    if not compacted and tp not in started and record.offset != span.start:
                        raise RangeError(
                            f"{topic}/{tp.partition}: offset {span.start} no longer exists "
                            f"(the next is {record.offset}): compacted or deleted")
                    started.add(tp)
                    yield record
            for tp in list(todo):
                if await self._consumer.position(tp) >= todo[tp].end:
                    del todo[tp]
