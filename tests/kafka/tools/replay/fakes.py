"""Topics in memory, read through TopicReader's own range logic: replay without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from context_assembler.kafka.records import Headers
from context_assembler.kafka.tools.reader import RangeError, Span, TopicReader


def record(
    topic: str, partition: int, offset: int, value: bytes | None, *, key: bytes | None = None,
    headers: Headers = (), timestamp: int = 1_764_547_200_000,
) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(
        topic=topic, partition=partition, offset=offset, timestamp=timestamp, timestamp_type=0,
        key=key, value=value, checksum=None, serialized_key_size=-1,
        serialized_value_size=-1, headers=list(headers),
    )


@dataclass
class Topics:
    """topic -> partition -> its records, in offset order (gaps allowed: compaction)."""

    data: dict[str, dict[int, list[ConsumerRecord[bytes, bytes]]]] = field(default_factory=dict)
    first: dict[tuple[str, int], int] = field(default_factory=dict)  # log start, if not 0

    def append(self, topic: str, partition: int, value: bytes | None, **fields: Any) -> int:
        records = self.data.setdefault(topic, {}).setdefault(partition, [])
        offset = records[-1].offset + 1 if records else self.first.get((topic, partition), 0)
        records.append(record(topic, partition, offset, value, **fields))
        return offset

    def partition(self, topic: str, partition: int) -> list[ConsumerRecord[bytes, bytes]]:
        return self.data.setdefault(topic, {}).setdefault(partition, [])


class FakeReader(TopicReader):
    """TopicReader over `Topics`: its `spans` is the real one; metadata and fetching are not."""

    def __init__(self, topics: Topics, *, fail_after: int | None = None) -> None:
        self.topics = topics
        self.fail_after = fail_after  # records read before the connection "breaks"
        self.read_count = 0

    async def __aenter__(self) -> FakeReader:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def partitions(self, topic: str) -> list[int]:
        if topic not in self.topics.data:
            raise RangeError(f"topic {topic!r} does not exist")
        return sorted(self.topics.data[topic])

    async def bounds(self, topic: str, partitions: Sequence[int]) -> dict[int, tuple[int, int]]:
        found = {}
        for p in partitions:
            records = self.topics.partition(topic, p)
            start = self.topics.first.get((topic, p), 0)
            found[p] = (start, records[-1].offset + 1 if records else start)
        return found

    async def offsets_at(
        self, topic: str, partitions: Sequence[int], when_ms: int
    ) -> dict[int, int | None]:
        return {
            p: next((r.offset for r in self.topics.partition(topic, p) if r.timestamp >= when_ms),
                    None)
            for p in partitions
        }

    async def follow(
        self, starts: Mapping[TopicPartition, int]
    ) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
        """What is stored from `starts` on; then nothing more ever comes."""
        for tp, start in starts.items():
            for found in self.topics.partition(tp.topic, tp.partition):
                if found.offset >= start:
                    yield found
        await asyncio.Event().wait()

    async def read(
        self, topic: str, spans: Sequence[Span], *, compacted: bool = False
    ) -> AsyncIterator[ConsumerRecord[bytes, bytes]]:
        for span in spans:
            for found in self.topics.partition(topic, span.partition):
                if span.start <= found.offset < span.end:
                    if self.fail_after is not None and self.read_count >= self.fail_after:
                        raise ConnectionError("the broker went away")
                    self.read_count += 1
                    yield found
