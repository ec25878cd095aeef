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
Records go out in producer batches (up to 1 MiB, 5 ms linger), and the broker refuses a
batch over a topic's limit as if its every record were too large; so a refusal first
replays the batch with one record per producer batch. A record refused alone teaches the
runner that topic's limit, so the replayed batch turns that event into a dead letter instead
(`EventRunner.learn`), and later batches stay within every limit learned. aiokafka counts the
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

from worker.kafka.membership import HEARTBEAT_INTERVAL_SECONDS, leave_on_stop
from worker.kafka.records import Origin, OutRecord, value_of
from worker.kafka.runner import (
    ENGINE_BATCH,
    PRODUCER_LINGER_MS,
    Attempts,
    EventRunner,
    Stopped,
    too_large,
)
from worker.kafka.settings import Settings

log = logging.getLogger(__name__)
BATCH_RECORDS = 200


class _Assignment(ConsumerRebalanceListener):  # type: ignore[misc]
    """The partitions held, and the open transaction a rebalance must wait for: revoked
    while it is open, its partitions' next owner would read from the offsets committed
    before it, and redo its events once it commits (seen as duplicates by read_committed
    readers whenever partitions moved between live workers)."""

    def __init__(self, wait_seconds: float) -> None:
        self.partitions: set[TopicPartition] = set()
        self.open: asyncio.Task[None] | None = None
        self._wait_seconds = wait_seconds

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        if self.open is not None and not self.open.done():
            # Bounded: a transaction stuck on a failing broker is aborted by its own error
            # path, and its batch is then read again from the committed offsets anyway.
            await asyncio.wait({self.open}, timeout=self._wait_seconds)
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
        self.assignment = _Assignment(settings.session_timeout_seconds)
        runner.metrics.assigned.set_function(lambda: len(self.assignment.partitions))
        self.healthy = False
        self._attempts: Attempts | None = None  # while transactions keep failing
        self._batch_bytes = runner.batch_bytes  # 1 while telling which record was refused
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
            group_instance_id=settings.group_instance_id,  # static membership if set
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(settings.session_timeout_seconds * 1000),
            heartbeat_interval_ms=int(HEARTBEAT_INTERVAL_SECONDS * 1000),
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
                    task = self.assignment.open = self.runner.spawn(
                        self._transact(consumer, batch))
                    await asyncio.wait({task})
                    if not task.cancelled():
                        task.result()
        except Stopped:
            pass
        finally:
            self.healthy = False
            await self._producer.stop()
            leave_on_stop(consumer)
            await consumer.stop()

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap_servers,
            transactional_id=self.settings.effective_transactional_id,
            enable_idempotence=True,
            acks="all",
            max_request_size=self.settings.max_message_bytes,
            max_batch_size=self._batch_bytes,
            linger_ms=PRODUCER_LINGER_MS,
        )

    async def _transact(
        self,
        consumer: AIOKafkaConsumer,
        batch: dict[TopicPartition, list],  # type: ignore[type-arg]
    ) -> None:
        producer = self._producer
        inputs = [(value_of(m), Origin.from_record(m)) for ms in batch.values() for m in ms]
        offsets = {partition: OffsetAndMetadata(messages[-1].offset + 1, "")
                   for partition, messages in batch.items()}
        try:
            with self.runner.settling() as origins:  # acknowledged once committed
                async with producer.transaction():
                    sent: list[tuple[OutRecord, asyncio.Future[Any]]] = []
                    # ENGINE_BATCH events per trip to the engine thread; each part's records
                    # are sent while the next part is assembled.
                    for start in range(0, len(inputs), ENGINE_BATCH):
                        part = inputs[start : start + ENGINE_BATCH]
                        outcomes = await self.runner.process_all(part)
                        origins.extend(origin for _, origin in part)
                        for (_, origin), outcome in zip(part, outcomes, strict=True):
                            for record in outcome.records:
                                sent.append(
                                    (record, await self._send(producer, record, origin)))
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
        if self._batch_bytes != self.runner.batch_bytes:  # back to batches, within the limits
            self._batch_bytes = self.runner.batch_bytes
            await self._renew_producer()

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
        if refused and self._batch_bytes > 1:
            # The broker refuses a batch over the topic's limit as if its every record were
            # too large: replay with a record per batch to tell which ones really are.
            log.warning("records refused as too large; replaying the batch, one record per "
                        "producer batch")
            self._batch_bytes = 1
            await self._renew_producer()
            return
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
