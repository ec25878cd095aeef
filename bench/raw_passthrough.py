"""The reference for any worker on this broker: aiokafka alone, each input copied to the prompts
and audit topics as is. `bench.kafka_bench` runs it as the top rung of its ladder.

Batched as a tuned client would be: `getmany`, every send of the batch gathered, producer
batches of 1 MiB with a 5 ms linger, then one commit of the batch's offsets (at least once,
outputs acknowledged before their input is committed). No engine, no HTTP, no metrics.
Configured by the worker's ASSEMBLER_* variables; SIGTERM stops it after the batch in hand.
"""

from __future__ import annotations

import asyncio
import signal

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from context_assembler.settings import load_settings

BATCH_BYTES = 1_048_576
LINGER_MS = 5


async def run() -> None:
    settings = load_settings()
    consumer = AIOKafkaConsumer(
        settings.input_topic, bootstrap_servers=settings.bootstrap_servers,
        group_id=settings.group_id, enable_auto_commit=False, auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=LINGER_MS,
        max_batch_size=BATCH_BYTES, max_request_size=settings.max_message_bytes,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await consumer.start()
    await producer.start()
    try:
        while not stopping.is_set():
            batch = await consumer.getmany(timeout_ms=100, max_records=500)
            if not batch:
                continue
            sends = []
            for messages in batch.values():
                for m in messages:
                    for topic in (settings.prompts_topic, settings.audit_topic):
                        sends.append(await producer.send(
                            topic, m.value, key=m.key, timestamp_ms=m.timestamp))
            await asyncio.gather(*sends)
            await consumer.commit({tp: messages[-1].offset + 1 for tp, messages in batch.items()})
    finally:
        await producer.stop()
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(run())
