"""The broker tooling works end to end: a real broker stores and serves keyed messages."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from harness.kafka import Broker

pytestmark = pytest.mark.kafka


async def test_keyed_messages_round_trip_through_three_partitions(broker: Broker) -> None:
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    await broker.create_topics({topic: 3})
    messages = {f"key-{i}".encode(): f"value-{i}".encode() for i in range(10)}

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    await producer.start()
    try:
        sent_to = {
            key: (await producer.send_and_wait(topic, value, key=key)).partition
            for key, value in messages.items()
        }
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        group_id=f"{topic}-group",  # a consumer group exercises the group coordinator too
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    received: list[tuple[bytes, bytes, int]] = []
    await consumer.start()
    try:
        assert consumer.partitions_for_topic(topic) == {0, 1, 2}
        async with asyncio.timeout(30):
            while len(received) < len(messages):
                batches = await consumer.getmany(timeout_ms=1000)
                received += [
                    (record.key, record.value, record.partition)
                    for records in batches.values()
                    for record in records
                ]
    finally:
        await consumer.stop()

    assert sorted(received) == sorted((k, v, sent_to[k]) for k, v in messages.items())
    assert len(set(sent_to.values())) > 1, "keys should spread over several partitions"
