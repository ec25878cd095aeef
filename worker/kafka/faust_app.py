"""At-least-once delivery on faust-streaming.

An input offset may be committed only after the prompt and the audit (or the dead letter)
are acknowledged by the broker. faust commits what was acked; it acks an event when its
agent moves on or raises (faust-streaming #315), and with concurrency > 1 it can commit
past an event still in flight (#606). So the agent reads a manual-ack stream (`noack`),
never raises for one event (bad input is an outcome, a failed send is retried until it is
acknowledged), and acks strictly in input order: an event is acked once its own records
and those of every event before it are acknowledged. The next events are assembled while
earlier ones are still being delivered, at most MAX_IN_FLIGHT at a time.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import deque
from functools import partial

import faust
from faust.types import EventT

from worker.kafka.pipeline import EventPipeline
from worker.kafka.records import Origin, OutRecord
from worker.settings import Settings

MAX_IN_FLIGHT = 200


def build_app(settings: Settings, pipeline: EventPipeline) -> faust.App:
    servers = [f"kafka://{server.strip()}" for server in settings.bootstrap_servers.split(",")]
    app = faust.App(
        settings.group_id,
        broker=servers,
        key_serializer="raw",
        value_serializer="raw",
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_commit_interval=1.0,
        # A killed replica holds its partitions until this runs out (faust's default: 60 s).
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=settings.session_timeout_seconds / 3,
        topic_disable_leader=True,  # no extra "<app>-__assignor-__leader" topic
        topic_allow_declare=False,  # topics are created by operations, not by the worker
        web_enabled=False,  # our own /metrics, /health, /ready (worker.observability.http)
        autodiscover=False,
        datadir=tempfile.mkdtemp(prefix="context-assembler-faust-"),  # faust insists on one
    )
    source = app.topic(settings.input_topic, key_type=bytes, value_type=bytes)

    async def send(record: OutRecord, timestamp_ms: int | None) -> None:
        timestamp = None if timestamp_ms is None else timestamp_ms / 1000.0
        await app.producer.send_and_wait(
            record.topic, record.key, record.value, None, timestamp, list(record.headers)
        )

    async def deliver(records: tuple[OutRecord, ...], timestamp_ms: int | None) -> None:
        await asyncio.gather(*(
            pipeline.retry_forever(f"produce to {r.topic}", partial(send, r, timestamp_ms))
            for r in records
        ))

    @app.agent(source, concurrency=1)
    async def assemble(stream: faust.StreamT[bytes]) -> None:
        in_flight: deque[tuple[EventT[bytes], asyncio.Task[None]]] = deque()
        room = asyncio.Semaphore(MAX_IN_FLIGHT)

        def ack_delivered(_: object = None) -> None:
            while in_flight and in_flight[0][1].done():
                event, _task = in_flight.popleft()
                event.ack()
                room.release()

        manual_acks = stream.noack()  # type: ignore[attr-defined]  # on Stream, not StreamT
        async for event in manual_acks.events():
            await room.acquire()
            message = event.message
            origin = Origin(
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                key=message.key,
                headers=tuple((k, bytes(v)) for k, v in (message.headers or ())),
                timestamp_ms=int(message.timestamp * 1000) if message.timestamp else None,
            )
            outcome = await pipeline.process(message.value or b"", origin)
            task = asyncio.create_task(deliver(outcome.records, origin.timestamp_ms))
            in_flight.append((event, task))
            task.add_done_callback(ack_delivered)

    return app
