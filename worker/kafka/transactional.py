"""Exactly-once delivery on aiokafka's transactional producer.

faust's own exactly_once does not hold for this app: killed mid-stream and restarted, it
published records that read_committed readers saw twice (205 duplicates for 2,000 inputs
in our run; faust-streaming #517, #177). `tests/integration/test_faust_exactly_once.py`
keeps that evidence. Here each batch is one Kafka transaction: the prompts, the audits,
the dead letters and the consumed offsets commit together or not at all, and readers with
isolation_level=read_committed see every request answered once.

A stable transactional id per replica (ASSEMBLER_TRANSACTIONAL_ID) lets a restarted
replica fence its predecessor and abort its open transaction at once.

aiokafka commits a transaction even when one of its records failed (the commit waits for
the sends, not for their success), so every send is checked before the offsets join the
transaction: a failed one aborts it and the batch is read again from the committed offsets.
A record refused as too large teaches the runner that topic's limit, so the replayed batch
turns that event into a dead letter instead (`EventRunner.learn`). aiokafka counts the
refused records in its idempotence sequence all the same, and the broker then refuses every
later send to that partition as out of order: a new producer (a new epoch) starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, OutOfOrderSequenceNumber, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from worker.kafka.records import Origin, OutRecord, value_of
from worker.kafka.runner import Attempts, EventRunner, Stopped, too_large
from worker.kafka.settings import Settings

log = logging.getLogger(__name__)
BATCH_RECORDS = 200


class _Assignment(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self) -> None:
        self.partitions: set[TopicPartition] = set()

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.partitions -= set(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.partitions |= set(assigned)


class _Undelivered(Exception):
    """Records of the open transaction that the broker did not take."""

    def __init__(self, failures: Sequence[tuple[OutRecord | None, BaseException]]) -> None:
        super().__init__(f"{len(failures)} records not delivered; first: {failures[0][1]!r}")
        self.failures = failures


class TransactionalWorker:
    def __init__(self, settings: Settings, runner: EventRunner) -> None:
        self.settings = settings
        self.runner = runner
        self.assignment = _Assignment()
        runner.metrics.assigned.set_function(lambda: len(self.assignment.partitions))
        self.healthy = False
        self._attempts: Attempts | None = None  # while transactions keep failing
        self._producer = self._new_producer()

    def ready(self) -> bool:
        return self.healthy and bool(self.assignment.partitions) and not self.runner.blocked

    def stop(self) -> None:
        self.runner.stop()

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
        consumer.subscribe([settings.input_topic], listener=self.assignment)
        self.runner.watch_lag(consumer.last_stable_offset)  # read_committed reads up to it
        try:
            await self.runner.retry_forever("connect consumer", consumer.start)
            await self.runner.retry_forever("connect producer", self._producer.start)
            while not self.runner.stopping.is_set():
                batch = await consumer.getmany(timeout_ms=500, max_records=BATCH_RECORDS)
                self.healthy = True
                if batch:
                    # A task, so that stopping can cancel it: an open transaction is aborted,
                    # and its batch is read again by the partitions' next owner.
                    task = self.runner.spawn(self._transact(consumer, batch))
                    await asyncio.wait({task})
                    if not task.cancelled():
                        task.result()
        except Stopped:
            pass
        finally:
            self.healthy = False
            await self._producer.stop()
            await consumer.stop()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap_servers,
            transactional_id=self.settings.effective_transactional_id,
            enable_idempotence=True,
            acks="all",
            max_request_size=self.settings.max_message_bytes,
        )

    async def _transact(
        self,
        consumer: AIOKafkaConsumer,
        batch: dict[TopicPartition, list],  # type: ignore[type-arg]
    ) -> None:
        producer = self._producer
        try:
            with self.runner.settling() as origins:  # acknowledged once committed
                async with producer.transaction():
                    offsets: dict[TopicPartition, OffsetAndMetadata] = {}
                    sent: list[tuple[OutRecord, asyncio.Future[Any]]] = []
                    for partition, messages in batch.items():
                        for message in messages:
                            origin = Origin.from_record(message)
                            outcome = await self.runner.process(value_of(message), origin)
                            origins.append(origin)
                            for record in outcome.records:
                                sent.append((record, await self._send(producer, record, origin)))
                        offsets[partition] = OffsetAndMetadata(messages[-1].offset + 1, "")
                    await _delivered(sent)
                    await producer.send_offsets_to_transaction(offsets, self.settings.group_id)
        except ProducerFenced:
            log.error("another replica took over transactional id %s; stopping",
                      self.settings.effective_transactional_id)
            self.stop()
            return
        except (KafkaError, _Undelivered) as error:
            # The transaction was aborted: rewind to what was committed and try again.
            self.healthy = False
            await self._failed(error)
            await self._rewind(consumer, list(batch))
            return
        if self._attempts is not None:
            self._attempts.close()
            self._attempts = None

    async def _send(
        self, producer: AIOKafkaProducer, record: OutRecord, origin: Origin
    ) -> asyncio.Future[Any]:
        """The send's future; a record the producer refuses at once fails it the same way."""
        try:
            future: asyncio.Future[Any] = await producer.send(
                record.topic,
                value=record.value,
                key=record.key,
                headers=list(record.headers),
                timestamp_ms=origin.timestamp_ms,
            )
        except Exception as error:
            if not too_large(error):
                raise
            future = asyncio.get_running_loop().create_future()
            future.set_exception(error)
        return future

    async def _failed(self, error: Exception) -> None:
        """Learn from records refused as too large and replay at once, or back off."""
        failures = error.failures if isinstance(error, _Undelivered) else [(None, error)]
        refused = [record for record, cause in failures if record and too_large(cause)]
        learned = [self.runner.learn(record) for record in refused]  # each, no short cut
        broken = [c for _, c in failures if isinstance(c, OutOfOrderSequenceNumber)]
        if refused or broken:
            await self._renew_producer()
        # Sends after a refused one on its partition fail out of order: consequences only.
        others = [(r, c) for r, c in failures if r not in refused and not (refused and c in broken)]
        if learned and all(learned) and not others:
            log.warning("transaction aborted, replaying the batch with smaller records")
            return
        record, cause = (others or failures)[0]
        if self._attempts is None:
            self._attempts = Attempts(self.runner, "transaction")
        await self._attempts.failed(
            cause, f"transaction (produce to {record.topic})" if record else None)

    async def _renew_producer(self) -> None:
        """A new epoch for the transactional id: idempotence sequences start afresh."""
        await self._producer.stop()
        self._producer = self._new_producer()
        await self.runner.retry_forever("connect producer", self._producer.start)

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

        await self.runner.retry_forever(f"read committed offset of {partition}", ask)
        return result


async def _delivered(sent: list[tuple[OutRecord, asyncio.Future[Any]]]) -> None:
    """Wait for every send; raise _Undelivered if any failed, so the transaction aborts."""
    if sent:
        await asyncio.wait([future for _, future in sent])  # unlike gather, never cancels them
    failures: list[tuple[OutRecord | None, BaseException]] = []
    for record, future in sent:
        error = asyncio.CancelledError() if future.cancelled() else future.exception()
        if error is not None:
            failures.append((record, error))
    if failures:
        raise _Undelivered(failures)
