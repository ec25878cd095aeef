"""`context-assembler produce FILE`: send JSONL events to the input topic (demos, tests).

Each line is sent as is (bad lines too: that is what the dead-letter topic is for), keyed
by its request_id when the line is a JSON object that has one.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson
from aiokafka import AIOKafkaProducer


def key_of(line: bytes) -> bytes | None:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    request_id = obj.get("request_id") if isinstance(obj, dict) else None
    return request_id.encode() if isinstance(request_id, str) else None


async def produce(bootstrap_servers: str, topic: str, lines: Iterable[bytes]) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all",
                                enable_idempotence=True)
    await producer.start()
    sent = 0
    try:
        for line in lines:
            raw = line.rstrip(b"\r\n")
            if raw.strip():
                await producer.send(topic, raw, key=key_of(raw))
                sent += 1
        await producer.flush()
    finally:
        await producer.stop()
    return sent
