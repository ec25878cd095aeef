"""Exactly-once delivery on aiokafka's transactional producers, one per input partition.

faust's own exactly_once does not hold for this app: killed mid-stream and restarted, it
published records that read_committed readers saw twice (bench/README.md, "Lore moved from
the code"; `tests/integration/test_faust_exactly_once.py` keeps the evidence). Here each
input partition's share of a commit round is one Kafka transaction: its prompts, audits and dead
letters and its consumed offset commit together or not at all, and readers with
isolation_level=read_committed see every request answered once.

Zombies are fenced the way Kafka Streams did before KIP-447 (its "exactly-once alpha"):
aiokafka 0.14 commits a transaction's offsets without the group's generation (TxnOffsetCommit
v0), so the group cannot stop a worker paused past the session timeout from committing, once
resumed, for partitions already given to another. The transactional id does: each input
partition has its own, `<prefix>-<topic>-<partition>` (ASSEMBLER_TRANSACTIONAL_ID, default the
group id), the same on every replica. Whoever is assigned a partition starts its producer
first (InitProducerId fences the previous owner's producer and aborts its open transaction)
and only then reads the committed offset and consumes from there. A producer fenced means
its partition moved: that partition's events in flight here are dropped unacknowledged, for
the next owner to redo, and the worker goes on with its other partitions. A producer replaced
for any other reason (its sender died, a batch was refused) is a new epoch too, which fences
whoever took the partition meanwhile if this worker is the zombie: so the partition is then
read again from its committed offset, as when it was assigned, and what was read before is
never committed on top of what the other owner committed. A revoked partition's producer
stops only once no transaction of its is in flight: aiokafka never ends a transaction whose
producer stopped under it, and the round waiting for it would hold every later round.

The worker drives the same `delivery.Delivery` as the faust runtime, as its commit strategy
(the `Runtime` protocol): events are read ahead (up to MAX_EVENTS_IN_FLIGHT read and not yet
committed), assembled in order, and an event is committable once assembled, in read order per
partition (`delivery.InOrder`). Commits go in rounds, one at a time (`delivery.CommitRounds`):
a round takes every event that became committable since the last one began and commits each
partition's share, its records and its offset, in one transaction, the partitions
concurrently. A round starts no sooner than the commit interval (ASSEMBLER_COMMIT_INTERVAL_MS)
after the previous one started, so at low rates events share fewer transactions. So an event
waits for at most the interval, the round in progress and its own. A read_committed reader of
an output partition sees nothing past its earliest open transaction: rounds that never
overlap let it see each round as soon as it commits.

aiokafka commits a transaction even when one of its records failed (the commit waits for
the sends, not for their success), so every send is checked before the offsets join the
transaction: a failed one aborts it and the partition is read again from its committed
offset. Records go out in producer batches (up to 1 MiB, 5 ms linger), and the broker refuses
a batch over a topic's limit as if its every record were too large; so a refusal first
replays the partition's events with one record per producer batch. A record refused alone
teaches the runner that topic's limit, so the replay turns that event into a dead letter
instead (`RecordSizes.learn`), and later batches stay within every limit learned. aiokafka
counts the refused records in its idempotence sequence all the same, and the broker then
refuses every later send to that partition as out of order: a new producer (a new epoch)
starts afresh.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    OutOfOrderSequenceNumber,
    ProducerFenced,
    UnsupportedCodecError,
)
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from context_assembler.collector import collect_less
from context_assembler.kafka.batches import read_ahead
from context_assembler.kafka.clients import KafkaClients, acl_hint, group_consumer, kafka_security
from context_assembler.kafka.errors import too_large
from context_assembler.kafka.records import Origin, OutRecord
from context_assembler.kafka.runtime.delivery import Arrivals, Delivery, Entry
from context_assembler.kafka.runtime.membership import leave_on_stop
from context_assembler.kafka.runtime.retries import Attempts, Stopped
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import (
    BATCH_RECORDS,
    MAX_EVENTS_IN_FLIGHT,
    POLL_TIMEOUT_MS,
    PRODUCER_LINGER_MS,
    READ_AHEAD_WAIT_SECONDS,
)
from context_assembler.settings import Settings

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Partition:
    """An input partition held here, with its transactional producer."""

    tp: TopicPartition
    producer: AIOKafkaProducer
    batch_bytes: int  # 1 while telling which record was refused
    attempts: Attempts | None = None  # while its transactions keep failing
    rewinds: int = 0  # events read before its latest rewind are stale
    transacting: bool = False  # in a transaction, which then stops the producer if released


@dataclass(frozen=True, eq=False)
class _Read:
    """A record of a partition held, as read at its `rewinds`."""

    partition: _Partition
    rewinds: int
    message: ConsumerRecord


class _Dropped(Exception):
    """The partition moved or was rewound since these events were read: whoever reads them
    next redoes them."""


class _Assignment(ConsumerRebalanceListener):  # type: ignore[misc]
    """The consumer's rebalances, handed to the worker: a revoked partition is given up once
    its transactions in flight ended (bounded), an assigned one taken once its producer fenced
    the previous owner's."""

    def __init__(self, worker: TransactionalWorker) -> None:
        self._worker = worker

    @property
    def partitions(self) -> set[TopicPartition]:
        return set(self._worker.held)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self._worker.release(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        await self._worker.take(assigned)


class _Undelivered(Exception):
    """Records of the open transaction that the broker did not take."""

    def __init__(self, failures: Sequence[tuple[OutRecord | None, BaseException]]) -> None:
        super().__init__(f"{len(failures)} records not delivered; first: {failures[0][1]!r}")
        self.failures = failures


class TransactionalWorker:
    """The exactly_once runtime: reads the input, holds its partitions' producers, and commits
    as `Delivery`'s commit strategy, one transaction per partition and round."""

    transactional = True

    def __init__(self, settings: Settings, runner: EventRunner) -> None:
        self.settings = settings
        self.runner = runner
        self.security = kafka_security(settings)
        self.held: dict[TopicPartition, _Partition] = {}  # producer started, position set
        self.assignment = _Assignment(self)
        runner.metrics.assigned.set_function(lambda: len(self.held))
        self.healthy = False
        self._consumer: AIOKafkaConsumer | None = None
        self.delivery = Delivery(runner, self, MAX_EVENTS_IN_FLIGHT,
                                 settings.commit_interval_seconds)
        self._acknowledged: list[Entry[_Read]] = []  # for the next round
        self._committing = asyncio.Lock()  # a round, or a hand-over's last commit
        self._fenced: dict[TopicPartition, float] = {}  # still assigned, producer fenced: since

    def ready(self) -> bool:
        return self.healthy and bool(self.held) and not self.runner.blocked

    def stop(self) -> None:
        self.runner.stop()

    async def run(self) -> None:
        settings = self.settings
        consumer = self._consumer = group_consumer(settings, self.security)
        consumer.subscribe([settings.input_topic], listener=self.assignment)
        self.runner.watch_lag(consumer.last_stable_offset)  # read_committed reads up to it
        arrived: Arrivals[_Read] = Arrivals()
        try:
            await self.runner.retry_forever("connect consumer", consumer.start)
            collect_less()  # the clients are up: freeze what start-up made
            reading = asyncio.create_task(self._read(consumer, arrived))
            try:
                await self.delivery.assemble(arrived)
                if not self.runner.stopping.is_set():
                    await reading  # it ended: raise its error, if any
            finally:
                reading.cancel()
            await self.delivery.stop()
        except Stopped:
            pass
        finally:
            self.healthy = False
            await self.delivery.close()
            await asyncio.gather(*(self._close(p) for p in self.held.values()))
            self.held.clear()
            leave_on_stop(consumer)
            await consumer.stop()

    async def _read(self, consumer: AIOKafkaConsumer, arrived: Arrivals[_Read]) -> None:
        """Read the partitions held into `arrived`, each fetch after its room in flight."""
        try:
            while not self.runner.stopping.is_set():
                while read_ahead.full and self.delivery.in_flight:
                    await asyncio.sleep(READ_AHEAD_WAIT_SECONDS)  # those in flight go first
                try:
                    batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS,
                                                   max_records=BATCH_RECORDS)
                except UnsupportedCodecError as error:
                    self.runner.cannot_decode(error)
                    # Read no further: only what was read before is assembled and committed.
                    await self.runner.stopping.wait()
                    return
                self.healthy = True
                # A fetch goes to the engine whole once there is room for all of it: put
                # event by event, the events trickling in as rounds freed room went to the
                # engine, and to transactions, a few at a time.
                reads = self._claim(batch)
                if reads:
                    await self.delivery.room(len(reads))
                    arrived.put(reads)
                if self._fenced:
                    await self._retake_fenced()
        finally:
            arrived.end()

    def _claim(self, batch: dict[TopicPartition, list[ConsumerRecord]]) -> list[_Read]:
        """The records of partitions held. Others are being taken (their producer starts, and
        then the partition is read from its committed offset) or were fenced: skipped."""
        claimed = []
        for tp, records in batch.items():
            partition = self.held.get(tp)
            if partition is not None:
                claimed += [_Read(partition, partition.rewinds, record) for record in records]
        return claimed

    def _new_producer(self, tp: TopicPartition, batch_bytes: int) -> AIOKafkaProducer:
        return KafkaClients.of(self.settings, self.security).producer(
            transactional_id=self.settings.transactional_id_for(tp.topic, tp.partition),
            max_batch_size=batch_bytes,
            linger_ms=PRODUCER_LINGER_MS,
        )

    async def take(self, assigned: Iterable[TopicPartition]) -> None:
        """Hold the partitions assigned, all at once."""
        fresh = [tp for tp in assigned if tp not in self.held]
        for tp in fresh:
            self._fenced.pop(tp, None)
        await asyncio.gather(*(self._open(tp) for tp in fresh))

    async def _open(self, tp: TopicPartition) -> None:
        """Start `tp`'s producer, which fences the previous owner's (its open transaction is
        aborted, or its commit completed, before the start returns); then read the committed
        offset and consume `tp` from there. In that order: aiokafka fetches the committed
        offset of a new partition while this listener runs, possibly before the fence."""
        consumer = self._consumer
        assert consumer is not None
        batch_bytes = self.runner.batch_bytes
        producer = self._new_producer(tp, batch_bytes)
        try:
            await self.runner.retry_forever(f"start the producer of {tp}", producer.start)
            position = await self._committed(consumer, tp)
        except BaseException:
            await producer.stop()
            raise
        if tp not in consumer.assignment():  # another rebalance meanwhile
            await producer.stop()
            return
        consumer.seek(tp, position)  # with no await until held: no record is read unclaimed
        consumer.resume(tp)
        self.held[tp] = _Partition(tp, producer, batch_bytes)

    async def release(self, revoked: Iterable[TopicPartition]) -> None:
        """Give the revoked partitions up once their deliveries under way ended, so that
        their next owner reads from the offsets they commit (bounded: a transaction stuck on
        a failing broker is aborted by its own error path, and its events are read again
        anyway).

        A partition's producer is stopped here only if no transaction of its is in flight:
        one may have begun after the hand-over, with events read before it, or outlived the
        bound. aiokafka never ends a transaction whose producer stopped under it (the commit
        waits forever), and that round would hold every later one. Such a transaction ends
        by itself (committed, or aborted once the next owner's producer fences it) and then
        stops its producer (`_transact`)."""
        revoked = list(revoked)
        await self.delivery.revoke([(tp.topic, tp.partition) for tp in revoked],
                                   self.settings.session_timeout_seconds)
        released = []
        for tp in revoked:
            self._fenced.pop(tp, None)
            if tp in self.held:
                released.append(self.held.pop(tp))
        await asyncio.gather(*(self._give_up(p) for p in released if not p.transacting))

    async def _give_up(self, partition: _Partition) -> None:
        """The partition is no longer held here: its failures no longer block /ready, and its
        producer stops."""
        if partition.attempts is not None:
            partition.attempts.close()
            partition.attempts = None
        await self._close(partition)

    async def _close(self, partition: _Partition) -> None:
        try:
            await partition.producer.stop()
        except Exception as error:  # it goes anyway; its id is fenced by the next owner
            log.warning("stopping the producer of %s failed: %r", partition.tp, error)

    async def deliver(self, entries: Sequence[Entry[_Read]]) -> None:
        """Nothing is sent before the commit: the records go out in its transactions. The
        entries of partitions handed over meanwhile will not be committed here."""
        self._settle([entry for entry in entries if entry.forgotten], _Dropped())

    def acknowledge(self, entries: Sequence[Entry[_Read]]) -> None:
        self._acknowledged += entries

    async def commit(self) -> None:
        """A round: each partition's events acknowledged since the last round began, in one
        transaction. A transaction that fails is aborted and its partition read again
        (`_transact`); what escapes that, other than stopping, is logged."""
        async with self._committing:
            entries, self._acknowledged = self._acknowledged, []
            by_partition: dict[_Partition, list[Entry[_Read]]] = {}
            for entry in entries:
                by_partition.setdefault(entry.token.partition, []).append(entry)
            ended = await asyncio.gather(
                *(self._transact(partition, its) for partition, its in by_partition.items()),
                return_exceptions=True)
        for error in ended:
            if isinstance(error, BaseException) and not isinstance(error, Stopped):
                log.error("a transaction failed: %r", error, exc_info=error)

    def _settle(self, entries: Sequence[Entry[_Read]], error: BaseException) -> None:
        """The entries' events will not be acknowledged by this worker."""
        for entry in entries:
            self.runner.settle(entry.event[1], error)

    async def _transact(self, partition: _Partition, entries: list[Entry[_Read]]) -> None:
        """Commit the entries' records and their last offset in one transaction. Entries read
        before the partition was rewound, or moved, are dropped (their events are read again).
        A partition given up while its transaction was in flight has its producer stopped
        here, once the transaction ended (`release`)."""
        tp = partition.tp
        current = self.held.get(tp) is partition
        fresh: list[Entry[_Read]] = []
        stale: list[Entry[_Read]] = []
        for entry in entries:
            ok = current and entry.token.rewinds == partition.rewinds
            (fresh if ok else stale).append(entry)
        self._settle(stale, _Dropped())
        if not fresh:
            return
        partition.transacting = True
        try:
            await self._commit_held(partition, fresh)
        finally:
            partition.transacting = False
            if self.held.get(tp) is not partition:  # given up meanwhile
                await self._give_up(partition)

    async def _commit_held(self, partition: _Partition, fresh: list[Entry[_Read]]) -> None:
        """`_transact` for entries read from the partition as held now."""
        tp = partition.tp
        died = _sender_error(partition.producer)
        if died is not None:
            # Fenced while idle, or the connection lost as it looked a coordinator up. These
            # events were read before: the partition's next owner, or this worker once it
            # replaced the producer (`_renew_producer`), reads them again.
            self._settle(fresh, _Dropped())
            if _fenced(died):
                await self._drop_fenced(partition)
            else:
                log.warning("the producer of %s stopped on %r, which it does not retry: "
                            "replacing it, and reading %s again from its committed offset",
                            tp, died, tp)
                await self._renew_producer(partition)
            return
        events = [entry.event for entry in fresh]
        try:
            with self.runner.settling() as origins:  # acknowledged once committed
                origins.extend(origin for _, origin, _ in events)
                producer = partition.producer
                offset = fresh[-1].offset + 1
                async with producer.transaction():
                    sent: list[tuple[OutRecord, asyncio.Future[Any]]] = []
                    for _, origin, outcome in events:
                        for record in outcome.records:
                            sent.append((record, await self._send(producer, record, origin)))
                    # The offset joins while the records are in flight (two round trips
                    # saved); a record not delivered still aborts the whole transaction.
                    joined = asyncio.ensure_future(producer.send_offsets_to_transaction(
                        {tp: OffsetAndMetadata(offset, "")}, self.settings.group_id))
                    try:
                        await _delivered(sent)
                    except BaseException:
                        await asyncio.wait({joined})  # settled before the abort
                        if not joined.cancelled():
                            joined.exception()  # the records' failure is the one raised
                        raise
                    await joined
            self.runner.metrics.transactions.inc()
        except Stopped:
            raise
        except Exception as error:  # a Kafka error, a record undelivered, or a bug
            if self.held.get(tp) is not partition:
                log.info("%s was handed over during a transaction that then failed (%r): its "
                         "next owner redoes its %d events", tp, error, len(fresh))
                return
            if _fenced(error):
                await self._drop_fenced(partition)
                return
            # The transaction was aborted: read again from what was committed and try again
            # (a bug too: a later round must never commit past the events it held).
            self.healthy = False
            if await self._failed(partition, error):
                await self._renew_producer(partition)  # which reads again too
            else:
                await self._rewind(partition)
            return
        if partition.attempts is not None:
            partition.attempts.close()
            partition.attempts = None
        if partition.batch_bytes != self.runner.batch_bytes:  # back to batches, within limits
            partition.batch_bytes = self.runner.batch_bytes
            await self._renew_producer(partition)

    async def _drop_fenced(self, partition: _Partition) -> None:
        """Another worker started this partition's producer: the partition was given to it
        while this one did not hear of it (paused past the session timeout, say). Its events
        here were not committed; the other worker redoes them. The consumer hears of the
        rebalance at its next heartbeat; meanwhile the partition is not read here."""
        tp = partition.tp
        log.error("the producer of %s (transactional id %s) was fenced: another worker holds "
                  "that partition now; its uncommitted events are dropped here and redone "
                  "there", tp, self.settings.transactional_id_for(tp.topic, tp.partition))
        if self.held.get(tp) is partition:
            del self.held[tp]
            consumer = self._consumer
            if consumer is not None and tp in consumer.assignment():
                consumer.pause(tp)
                self._fenced[tp] = asyncio.get_running_loop().time()
        await self._give_up(partition)

    async def _retake_fenced(self) -> None:
        """A fenced partition still assigned here a session timeout later, with no rebalance
        (its transaction outlived transaction.timeout.ms, say): take it back as if assigned."""
        consumer = self._consumer
        assert consumer is not None
        now = asyncio.get_running_loop().time()
        for tp, since in list(self._fenced.items()):
            if tp not in consumer.assignment():
                del self._fenced[tp]
            elif now - since >= self.settings.session_timeout_seconds:
                del self._fenced[tp]
                log.warning("%s is still assigned here %.0fs after its producer was fenced, "
                            "with no rebalance: taking it back", tp, now - since)
                await self._open(tp)

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

    async def _failed(self, partition: _Partition, error: Exception) -> bool:
        """Learn from records refused as too large and replay at once, or back off. True if
        the partition needs a new producer."""
        failures = error.failures if isinstance(error, _Undelivered) else [(None, error)]
        refused = [record for record, cause in failures if record and too_large(cause)]
        if refused and partition.batch_bytes > 1:
            # The broker refuses a batch over the topic's limit as if its every record were
            # too large: replay with a record per batch to tell which ones really are.
            log.warning("records refused as too large; replaying %s's events, one record per "
                        "producer batch", partition.tp)
            partition.batch_bytes = 1
            return True
        learned = [self.runner.learn(record) for record in refused]  # each, no short cut
        broken = [c for _, c in failures if isinstance(c, OutOfOrderSequenceNumber)]
        # Sends after a refused one on its partition fail out of order: consequences only.
        others = [(r, c) for r, c in failures if r not in refused and not (refused and c in broken)]
        if learned and all(learned) and not others:
            log.warning("transaction aborted, replaying %s's events with smaller records",
                        partition.tp)
            return True
        # A refusal an ACL would lift is the cause; the sends after it in the transaction
        # only fail with InvalidTxnState.
        candidates = others or failures
        record, cause = next((f for f in candidates if acl_hint(f[1])), candidates[0])
        if partition.attempts is None:
            partition.attempts = Attempts(self.runner.retries,
                                          f"transaction of {partition.tp}")
        await partition.attempts.failed(
            cause, f"transaction of {partition.tp} (produce to {record.topic})" if record else None)
        return bool(refused or broken)

    async def _renew_producer(self, partition: _Partition) -> None:
        """A new epoch for the partition's transactional id: idempotence sequences start
        afresh. Not for a partition given up meanwhile: that would fence its new owner.

        The new epoch fences whoever else holds the id, and this worker may be a zombie that
        lost the partition without hearing of it yet. So, as when a partition is assigned,
        it is then read again from the offset committed (`_rewind`), and nothing read before
        is committed on top of what the other owner committed meanwhile."""
        await self._close(partition)
        if self.held.get(partition.tp) is not partition:
            return
        partition.producer = self._new_producer(partition.tp, partition.batch_bytes)
        await self.runner.retry_forever(f"start the producer of {partition.tp}",
                                        partition.producer.start)
        await self._rewind(partition)

    async def _rewind(self, partition: _Partition) -> None:
        """Read the partition again from its committed offset; what was read past it before
        is dropped (`rewinds`)."""
        consumer = self._consumer
        assert consumer is not None
        tp = partition.tp
        if self.held.get(tp) is not partition or tp not in consumer.assignment():
            return
        position = await self._committed(consumer, tp)
        if self.held.get(tp) is partition and tp in consumer.assignment():
            partition.rewinds += 1
            consumer.seek(tp, position)

    async def _committed(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """The committed offset of `tp`, or its first offset if none was committed."""
        result = 0

        async def ask() -> None:
            nonlocal result
            committed = await consumer.committed(tp)
            if committed is None:
                committed = (await consumer.beginning_offsets([tp]))[tp]
            result = committed

        await self.runner.retry_forever(f"read committed offset of {tp}", ask)
        return result


def _sender_error(producer: AIOKafkaProducer) -> BaseException | None:
    """What stopped aiokafka's sender, if it stopped: an error it does not retry, such as the
    producer fenced or the connection lost while it looked a coordinator up. The producer then
    refuses every transaction, by assertion."""
    task: asyncio.Task[None] | None = producer._sender.sender_task
    if task is None or not task.done() or task.cancelled():
        return None
    return task.exception()


def _fenced(error: BaseException) -> bool:
    """Raised, or a send failed, because another producer with the id started since."""
    causes = [c for _, c in error.failures] if isinstance(error, _Undelivered) else [error]
    return any(isinstance(cause, ProducerFenced) for cause in causes)


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
