"""Exactly-once delivery on aiokafka's transactional producer.

faust's own exactly_once does not hold for this app: killed mid-stream and restarted, it
published records that read_committed readers saw twice (205 duplicates for 2,000 inputs
in our run; faust-streaming #517, #177). `tests/integration/test_faust_exactly_once.py`
keeps that evidence. Here each batch is one Kafka transaction: the prompts, the audits,
the dead letters and the consumed offsets commit together or not at all, and readers with
isolation_level=read_committed see every request answered once.

A stable transactional id per replica (ASSEMBLER_TRANSACTIONAL_ID) lets a restarted
replica fence its predecessor and abort its open transaction at once.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from worker.kafka.pipeline import EventPipeline
from worker.kafka.records import Origin
from worker.settings import Settings

log = logging.getLogger("context_assembler.worker")
BATCH_RECORDS = 200


class _Assignment(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.partitions: set[TopicPartition] = set()

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.partitions -= set(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.partitions |= set(assigned)


class TransactionalWorker:
    def __init__(self, settings: Settings, pipeline: EventPipeline) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.assignment = _Assignment()
        pipeline.metrics.assigned.set_function(lambda: len(self.assignment.partitions))
        self.healthy = False
        self._stopping = asyncio.Event()

    def ready(self) -> bool:
        return self.healthy and bool(self.assignment.partitions)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        settings = self.settings
        consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(settings.session_timeout_seconds * 1000),
            isolation_level="read_committed",
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers,
            transactional_id=settings.effective_transactional_id,
            enable_idempotence=True,
            acks="all",
        )
        consumer.subscribe([settings.input_topic], listener=self.assignment)
        await self.pipeline.retry_forever("connect consumer", consumer.start)
        await self.pipeline.retry_forever("connect producer", producer.start)
        try:
            while not self._stopping.is_set():
                batch = await consumer.getmany(timeout_ms=500, max_records=BATCH_RECORDS)
                self.healthy = True
                if batch:
                    await self._transact(consumer, producer, batch)
        finally:
            self.healthy = False
            await producer.stop()
            await consumer.stop()

    async def _transact(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        batch: dict[TopicPartition, list],  # type: ignore[type-arg]
    ) -> None:
        try:
            async with producer.transaction():
                offsets: dict[TopicPartition, OffsetAndMetadata] = {}
                for partition, messages in batch.items():
                    for message in messages:
                        origin = Origin(
                            topic=message.topic,
                            partition=message.partition,
                            offset=message.offset,
                            key=message.key,
                            headers=tuple((k, bytes(v)) for k, v in message.headers),
                            timestamp_ms=message.timestamp,
                        )
                        outcome = await self.pipeline.process(message.value or b"", origin)
                        for record in outcome.records:
                            await producer.send(
                                record.topic,
                                value=record.value,
                                key=record.key,
                                headers=list(record.headers),
                                timestamp_ms=origin.timestamp_ms,
                            )
                    offsets[partition] = OffsetAndMetadata(messages[-1].offset + 1, "")
                await producer.send_offsets_to_transaction(offsets, self.settings.group_id)
        except ProducerFenced:
            log.error("another replica took over transactional id %s; stopping",
                      self.settings.effective_transactional_id)
            self.stop()
        except KafkaError as error:
            # The transaction was aborted: rewind to what was committed and try again.
            self.healthy = False
            self.pipeline.metrics.retries.inc()
            log.warning("transaction aborted, replaying the batch: %r", error)
            await asyncio.sleep(1.0)
            await self._rewind(consumer, list(batch))

    async def _rewind(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
        for partition in partitions:
            if partition not in consumer.assignment():
                continue
            committed = await self._committed(consumer, partition)
            if committed is None:
                await consumer.seek_to_beginning(partition)
            else:
                consumer.seek(partition, committed)

    async def _committed(
        self, consumer: AIOKafkaConsumer, partition: TopicPartition
    ) -> int | None:
        result: int | None = None

        async def ask() -> None:
            nonlocal result
            result = await consumer.committed(partition)

        await self.pipeline.retry_forever(f"read committed offset of {partition}", ask)
        return result
