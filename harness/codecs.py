"""Clients that are not aiokafka, and what codec a topic's batches were written with.

librdkafka (confluent-kafka) is what upstream producers in Go, .NET and Python commonly run
on; it compresses with any codec the broker knows, and reads as the prompts' consumers do.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer import fetcher
from aiokafka.record.memory_records import MemoryRecords
from confluent_kafka import Consumer, KafkaError, Message, Producer

from harness.kafka import Broker
from harness.worker import partitions_of

CODECS = ("gzip", "snappy", "lz4", "zstd")
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}  # batch header ids
# A v2 record batch: base offset (8 bytes), length of the rest (4), leader epoch (4), magic
# (1), CRC (4), attributes (2: the codec in bits 0-2, control batch bit 5), and so on.
BATCH_HEADER = 61
CONTROL = 0x20


def librdkafka_produce(broker: Broker, topic: str, codec: str,
                       records: Iterable[tuple[bytes, bytes]],
                       config: Mapping[str, object] = {}, timeout: float = 60) -> None:
    """Send (key, value) records compressed with `codec`, as an idempotent librdkafka
    producer does (`config` adds to or overrides its settings); raises if the broker did not
    acknowledge every one within `timeout` seconds."""
    failures: list[str] = []

    def delivered(error: KafkaError | None, _: Message) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers,
                         "compression.type": codec, "enable.idempotence": True,
                         "linger.ms": 20, **config})
    for key, value in records:
        producer.produce(topic, value=value, key=key, on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(timeout)
    assert left == 0 and not failures, f"{codec}: {left} unsent, failures {failures[:3]}"


def librdkafka_read(broker: Broker, topic: str, count: int, timeout: float = 120,
                    settle: float = 2.0) -> list[tuple[bytes, bytes]]:
    """(key, value) of every committed record of `topic` from the beginning, read by a
    librdkafka consumer with isolation.level=read_committed: until `count` arrived, then
    `settle` seconds more, to see any duplicates."""
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers,
                         "group.id": f"librdkafka-{uuid.uuid4().hex[:8]}",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    records: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    settled: float | None = None
    try:
        while time.monotonic() < (settled or deadline):
            message = consumer.poll(0.2)
            if message is None:
                if settled is None and len(records) >= count:
                    settled = time.monotonic() + settle
                continue
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, str(error)
                continue
            records.append((message.key() or b"", message.value() or b""))
    finally:
        consumer.close()
    return records


@dataclass
class Batches:
    """A topic's record batches as stored, so as sent: the broker keeps a producer's batches
    whole (compression.type=producer)."""

    codecs: set[str] = field(default_factory=set)  # control batches left out: never compressed
    size: int = 0  # bytes, batch headers included
    _seen: set[tuple[bytes, bytes]] = field(default_factory=set, repr=False)

    def add(self, data: bytes) -> None:
        """The whole batches of a fetch's records; one fetched twice (a partial one at the
        end of a fetch comes whole in the next) counts once."""
        position = 0
        while position + BATCH_HEADER <= len(data):
            end = position + 12 + int.from_bytes(data[position + 8:position + 12], "big")
            if end > len(data):
                break
            identity = (data[position:position + 8], data[position + 17:position + 21])
            if identity not in self._seen:  # (base offset, CRC)
                self._seen.add(identity)
                self.size += end - position
                attributes = int.from_bytes(data[position + 21:position + 23], "big")
                if not attributes & CONTROL:
                    self.codecs.add(CODEC_NAMES[attributes & 0x07])
            position = end


async def batches_of(broker: Broker, topic: str) -> Batches:
    """Every record batch of `topic`, read from the beginning."""
    batches = Batches()

    def watched(data: bytes) -> Any:
        batches.add(bytes(data))
        return MemoryRecords(data)

    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    tps = [TopicPartition(topic, p) for p in await partitions_of(broker, topic)]
    await consumer.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fetcher, "MemoryRecords", watched)  # before the first fetch
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                await consumer.getmany(timeout_ms=200)
    finally:
        await consumer.stop()
    return batches
