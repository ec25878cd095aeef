"""`context-assembler produce FILE`: send JSONL events to the input topic (demos, tests).

Each line is sent as is (bad lines too: that is what the dead-letter topic is for), keyed
by its request_id when the line is a JSON object that has one. The topic is looked up
first: a missing topic or an unreachable broker is one line for the operator, where the
producer would retry its metadata for a minute, logging every attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import orjson
from aiokafka.errors import TopicAuthorizationFailedError, UnknownTopicOrPartitionError

from context_assembler.kafka.clients import REFUSED_CONNECTION, KafkaClients
from context_assembler.kafka.errors import answered
from context_assembler.kafka.tools.topics import missing_topic, not_authorized, refused


def key_of(line: bytes) -> bytes | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    request_id = obj.get("request_id") if isinstance(obj, dict) else None
    return request_id.encode() if isinstance(request_id, str) else None


async def check_topic(clients: KafkaClients, topic: str) -> None:
    """Raise TopicError unless the broker answers and has `topic`."""
    admin = clients.admin()
    try:
        await admin.start()
        described = await admin.describe_topics([topic])
    except (*REFUSED_CONNECTION, TimeoutError):
        raise await refused(clients) from None
    finally:
        await admin.close()
    if any(answered(t, UnknownTopicOrPartitionError) for t in described) or not described:
        raise missing_topic(topic)
    if any(answered(t, TopicAuthorizationFailedError) for t in described):
        raise not_authorized(topic, "DESCRIBE")


async def produce(clients: KafkaClients, topic: str, lines: Iterable[bytes]
                  ) -> list[tuple[int, int]]:
    """Send each non-blank line; the partition and offset of each, in order."""
    await check_topic(clients, topic)
    producer = clients.producer()
    try:
        await producer.start()
    except REFUSED_CONNECTION:
        raise await refused(clients) from None
    deliveries = []
    try:
        for line in lines:
            raw = line.rstrip(b"\r\n")
            if raw.strip():
                deliveries.append(await producer.send(topic, raw, key=key_of(raw)))
        return [(sent.partition, sent.offset) for sent in await asyncio.gather(*deliveries)]
    finally:
        await producer.stop()
