"""The exactly_once path's partitions and their producers, with stand-ins for aiokafka's
producer and consumer (the transactions themselves are tested on a real broker in
tests/integration, the zombie's fence in test_zombie_fencing.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, ProducerFenced
from aiokafka.structs import ConsumerRecord

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka import clients
from context_assembler.kafka.records import Origin
from context_assembler.kafka.runtime import transactional
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.runtime.transactional import TransactionalWorker
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings
from tests.kafka.test_records import GOOD

TP0, TP1 = TopicPartition("in", 0), TopicPartition("in", 1)
Journal = list[tuple[str, ...]]


class FakeProducer:
    """Records what is asked of it in the shared journal; `fenced` ids fail at their offsets."""

    def __init__(self, journal: Journal, fenced: set[str], gate: asyncio.Event,
                 **config: Any) -> None:
        self.config = config
        self._gate = gate  # a transaction's offsets join once it is set
        self.id: str = config["transactional_id"]
        self._journal = journal
        self._fenced = fenced
        self.stopped = False
        self.committed: list[dict[TopicPartition, int]] = []
        self.aborted = 0
        self.sent = 0
        self._sender = self  # aiokafka's sender: its task ends on an error it does not retry
        self.sender_task: asyncio.Future[None] | None = None

    def die(self, error: BaseException) -> None:
        self.sender_task = asyncio.get_running_loop().create_future()
        self.sender_task.set_exception(error)

    async def start(self) -> None:
        await asyncio.sleep(0.01)  # InitProducerId: a round trip
        self._journal.append(("started", self.id))

    async def stop(self) -> None:
        self.stopped = True
        self._journal.append(("stopped", self.id))

    def transaction(self) -> FakeProducer:
        return self

    async def __aenter__(self) -> None:
        assert self.sender_task is None, "Invalid state transition FATAL_ERROR -> IN_TRANSACTION"
        return None

    async def __aexit__(self, kind: object, error: object, trace: object) -> None:
        if self.stopped and kind is None:  # aiokafka 0.14: stopped, it never commits nor fails
            await asyncio.Event().wait()
        if kind is not None:
            self.aborted += 1

    async def send(self, topic: str, **_: Any) -> asyncio.Future[None]:
        self.sent += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def send_offsets_to_transaction(self, offsets: dict[TopicPartition, Any],
                                          group_id: str) -> None:
        await self._gate.wait()
        if self.id in self._fenced:
            raise ProducerFenced()
        self.committed.append({tp: meta.offset for tp, meta in offsets.items()})


class FakeConsumer:
    def __init__(self, journal: Journal, committed: dict[TopicPartition, int]) -> None:
        self._journal = journal
        self._committed = committed
        self.assigned: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def committed(self, tp: TopicPartition) -> int | None:
        self._journal.append(("committed", str(tp.partition)))
        return self._committed.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    def pause(self, tp: TopicPartition) -> None:
        self.paused.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        self.paused.discard(tp)


class Rig:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
        self.journal: Journal = []
        self.fenced: set[str] = set()
        self.producers: list[FakeProducer] = []
        self.gate = asyncio.Event()  # cleared: transactions wait
        self.gate.set()

        def producer(**config: Any) -> FakeProducer:
            made = FakeProducer(self.journal, self.fenced, self.gate, **config)
            self.producers.append(made)
            return made

        monkeypatch.setattr(clients, "AIOKafkaProducer", producer)
        config = Settings.model_validate({
            "prompts_topic": "prompts", "audit_topic": "audit", "dlq_topic": "dlq",
            "input_topic": "in", "group_id": "assemblers", "processing_guarantee": "exactly_once",
            "retry_backoff_max_seconds": 0.05, **settings})
        self.runner = EventRunner(config, PolicyRegistry(Policy()), Metrics())
        self.worker = TransactionalWorker(config, self.runner)
        self.consumer = FakeConsumer(self.journal, {TP0: 7, TP1: 3})
        self.worker._consumer = self.consumer

    async def assign(self, *tps: TopicPartition) -> None:
        self.consumer.assigned |= set(tps)
        await self.worker.assignment.on_partitions_assigned(list(tps))

    async def deliver(self, batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
                      ) -> asyncio.Task[None] | None:
        """Read `batch` as the worker reads a fetch (only partitions held), assemble it and
        start its delivery, which ends once its round of transactions did."""
        return await self.worker.delivery.handle(self.worker._claim(batch))

    async def batch(self, batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
                    ) -> None:
        """`deliver` the batch and wait for its round."""
        task = await self.deliver(batch)
        if task is not None:
            await task

    def producer(self, tp: TopicPartition) -> FakeProducer:
        return next(p for p in reversed(self.producers) if p.id.endswith(f"-{tp.partition}"))

    def in_flight(self) -> float:
        return self.runner.metrics.in_flight._value.get()  # type: ignore[no-any-return]


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    made = Rig(monkeypatch)
    yield made
    made.runner.close()


def records(tp: TopicPartition, first: int, count: int) -> list[ConsumerRecord[bytes, bytes]]:
    return [ConsumerRecord(tp.topic, tp.partition, offset, 1_700_000_000_000, 0, b"k", GOOD,
                           None, 1, len(GOOD), [])
            for offset in range(first, first + count)]


def test_each_input_partition_has_its_own_transactional_id_whatever_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(group_id="assemblers")
    monkeypatch.setattr("socket.gethostname", lambda: "pod-a")
    assert settings.transactional_id_for("in", 4) == "assemblers-in-4"
    monkeypatch.setattr("socket.gethostname", lambda: "pod-b")
    assert settings.transactional_id_for("in", 4) == "assemblers-in-4"
    prefixed = Settings(group_id="assemblers", transactional_id="eos")
    assert prefixed.transactional_id_for("in", 0) == "eos-in-0"
    assert prefixed.transactional_id_for("in", 0) != prefixed.transactional_id_for("in", 1)


async def test_an_assigned_partition_is_read_only_after_its_producer_fenced_the_last_owner(
    rig: Rig,
) -> None:
    await rig.assign(TP0, TP1)
    assert sorted(p.id for p in rig.producers) == ["assemblers-in-0", "assemblers-in-1"]
    for tp in (TP0, TP1):
        started = rig.journal.index(("started", f"assemblers-in-{tp.partition}"))
        assert started < rig.journal.index(("committed", str(tp.partition))), rig.journal
    assert rig.consumer.positions == {TP0: 7, TP1: 3}
    assert rig.worker.assignment.partitions == {TP0, TP1}


async def test_records_of_a_partition_not_held_yet_are_left_for_after_its_fence(rig: Rig) -> None:
    await rig.assign(TP0)
    claimed = rig.worker._claim({TP0: records(TP0, 7, 2), TP1: records(TP1, 0, 2)})
    assert [(read.partition.tp, read.message.offset) for read in claimed] == [(TP0, 7), (TP0, 8)]


async def test_a_batch_commits_each_partitions_records_and_offset_in_its_own_transaction(
    rig: Rig,
) -> None:
    await rig.assign(TP0, TP1)
    await rig.batch({TP0: records(TP0, 7, 3), TP1: records(TP1, 3, 2)})
    assert rig.producer(TP0).committed == [{TP0: 10}]
    assert rig.producer(TP1).committed == [{TP1: 5}]
    assert (rig.producer(TP0).sent, rig.producer(TP1).sent) == (6, 4)  # a prompt and an audit
    assert rig.in_flight() == 0


async def test_batches_assembled_while_a_round_commits_share_the_next_round(rig: Rig) -> None:
    await rig.assign(TP0, TP1)
    rig.gate.clear()  # the first round's transactions stay open
    first = await rig.deliver({TP0: records(TP0, 7, 2)})
    while not rig.producer(TP0).sent:
        await asyncio.sleep(0.01)
    later = [await rig.deliver(batch) for batch in (
        {TP0: records(TP0, 9, 1), TP1: records(TP1, 3, 2)}, {TP0: records(TP0, 10, 2)})]
    while len(rig.worker._acknowledged) < 5:
        await asyncio.sleep(0.01)
    tasks = [task for task in (first, *later) if task is not None]
    assert rig.producer(TP0).committed == [] and len(tasks) == 3
    assert not any(task.done() for task in tasks)
    rig.gate.set()
    await asyncio.gather(*tasks)
    # One transaction per partition and round, its offset after the round's last event.
    assert rig.producer(TP0).committed == [{TP0: 9}, {TP0: 12}]
    assert rig.producer(TP1).committed == [{TP1: 5}]
    assert rig.in_flight() == 0


async def test_a_fenced_partition_is_dropped_and_the_worker_goes_on(
    rig: Rig, caplog: pytest.LogCaptureFixture,
) -> None:
    await rig.assign(TP0, TP1)
    fenced = rig.producer(TP0)
    first = rig.worker._claim({TP0: records(TP0, 7, 3), TP1: records(TP1, 3, 2)})
    second = rig.worker._claim({TP0: records(TP0, 10, 1)})  # read before the fence is known
    rig.fenced.add(fenced.id)  # another worker started assemblers-in-0 since
    with caplog.at_level(logging.ERROR):
        for claimed in (first, second):
            task = await rig.worker.delivery.handle(claimed)
            assert task is not None
            await task
    assert fenced.committed == [] and fenced.stopped
    assert rig.producer(TP1).committed == [{TP1: 5}]
    assert rig.worker.assignment.partitions == {TP1}
    assert rig.consumer.paused == {TP0}, "a fenced partition is not read until the rebalance"
    assert not rig.runner.stopping.is_set()
    assert rig.in_flight() == 0, "the dropped events are settled, unacknowledged"
    assert [p.id for p in rig.producers].count(fenced.id) == 1, "fenced the partition's owner"
    assert any("fenced" in r.getMessage() and "assemblers-in-0" in r.getMessage()
               for r in caplog.records)
    # The rebalance gives the partition back (or to another worker): a new producer fences.
    await rig.worker.assignment.on_partitions_revoked([TP0, TP1])
    await rig.assign(TP0, TP1)
    assert rig.producer(TP0) is not fenced and rig.consumer.paused == set()
    assert rig.worker.assignment.partitions == {TP0, TP1}


async def test_records_read_before_a_rewind_are_not_committed(rig: Rig) -> None:
    await rig.assign(TP0)
    stale = rig.worker._claim({TP0: records(TP0, 7, 2)})
    rig.worker.held[TP0].rewinds += 1  # a failed transaction rewound the partition
    task = await rig.worker.delivery.handle(stale)
    assert task is not None
    await task
    assert rig.producer(TP0).committed == []
    assert rig.in_flight() == 0


async def test_a_transaction_failing_on_a_bug_is_read_again_and_nothing_past_it_commits(
    rig: Rig, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure that is no Kafka error (a bug) aborts the transaction like any other: the
    partition is read again from its committed offset, so a later round cannot commit past
    the events it held (what was read before the rewind is dropped: the test above)."""
    await rig.assign(TP0)
    producer = rig.producer(TP0)

    async def broken(topic: str, **_: Any) -> asyncio.Future[None]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(producer, "send", broken)
    rig.consumer.positions[TP0] = 10  # read up to 10
    await rig.batch({TP0: records(TP0, 7, 3)})
    assert producer.committed == [] and producer.aborted == 1
    assert rig.worker.held[TP0].rewinds == 1
    assert rig.consumer.positions[TP0] == 7  # read again from what was committed
    assert "RuntimeError('a bug')" in (rig.runner.blocked or "")  # /ready says why


async def test_a_revocation_waits_for_the_batch_in_flight_then_closes_the_producer(
    rig: Rig,
) -> None:
    await rig.assign(TP0, TP1)
    release = asyncio.Event()

    async def in_flight() -> None:
        await release.wait()

    batch = asyncio.create_task(in_flight())
    rig.worker.delivery._deliveries[batch] = {("in", 0)}
    revoking = asyncio.create_task(rig.worker.assignment.on_partitions_revoked([TP0]))
    await asyncio.sleep(0.05)
    assert not revoking.done(), "gave the partition away while its transaction was open"
    assert not rig.producer(TP0).stopped
    release.set()
    await revoking
    assert rig.producer(TP0).stopped and not rig.producer(TP1).stopped
    assert rig.worker.assignment.partitions == {TP1}


async def test_a_revocation_gives_up_waiting_after_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rig = Rig(monkeypatch)
    await rig.assign(TP0)
    async def never_ends() -> None:
        await asyncio.Event().wait()

    stuck = asyncio.create_task(never_ends())
    rig.worker.delivery._deliveries[stuck] = {("in", 0)}
    loop = asyncio.get_running_loop()
    began = loop.time()
    rig.worker.settings = rig.worker.settings.model_copy(update={"session_timeout_seconds": 0.05})
    await rig.worker.assignment.on_partitions_revoked([TP0])
    assert loop.time() - began < 1
    assert rig.producer(TP0).stopped and rig.worker.assignment.partitions == set()
    stuck.cancel()
    rig.runner.close()


async def test_a_transaction_outliving_the_hand_over_ends_before_its_producer_stops(
    rig: Rig,
) -> None:
    """Stopped under its transaction, the producer would never end it, and that round would
    hold every later one: the partitions' commits would stall for good."""
    rig.worker.settings = rig.worker.settings.model_copy(update={"session_timeout_seconds": 0.05})
    await rig.assign(TP0, TP1)
    rig.gate.clear()  # TP0's transaction stays open past the hand-over's bound
    delivery = await rig.deliver({TP0: records(TP0, 7, 2)})
    while not rig.producer(TP0).sent:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(rig.worker.assignment.on_partitions_revoked([TP0]), timeout=1)
    assert rig.worker.assignment.partitions == {TP1}
    assert not rig.producer(TP0).stopped, "stopped under its open transaction"
    rig.gate.set()
    assert delivery is not None
    await asyncio.wait_for(delivery, timeout=1)
    assert rig.producer(TP0).stopped, "left running once its transaction ended"
    assert rig.producer(TP0).committed == [{TP0: 9}]
    await asyncio.wait_for(rig.batch({TP1: records(TP1, 3, 1)}), timeout=1)
    assert rig.producer(TP1).committed == [{TP1: 4}], "a later round was held"
    assert rig.in_flight() == 0


async def test_without_a_batch_in_flight_a_revocation_is_immediate(rig: Rig) -> None:
    await rig.assign(TP0, TP1)
    await asyncio.wait_for(rig.worker.assignment.on_partitions_revoked([TP0, TP1]), timeout=1)
    assert rig.worker.assignment.partitions == set()
    assert all(p.stopped for p in rig.producers)


async def test_a_fenced_partition_left_assigned_with_no_rebalance_is_taken_back_later(
    rig: Rig,
) -> None:
    await rig.assign(TP0, TP1)
    fenced = rig.producer(TP0)
    rig.fenced.add(fenced.id)
    await rig.batch({TP0: records(TP0, 7, 1)})
    await rig.worker._retake_fenced()
    assert rig.worker.assignment.partitions == {TP1}, "taken back before the session timeout"
    rig.fenced.clear()  # its transaction had timed out, say: no other owner since
    rig.worker.settings = rig.worker.settings.model_copy(update={"session_timeout_seconds": 0})
    await rig.worker._retake_fenced()
    assert rig.producer(TP0) is not fenced and rig.consumer.paused == set()
    assert rig.worker.assignment.partitions == {TP0, TP1} and not rig.worker._fenced


async def test_a_fenced_partition_assigned_elsewhere_since_is_forgotten(rig: Rig) -> None:
    await rig.assign(TP0)
    rig.fenced.add(rig.producer(TP0).id)
    await rig.batch({TP0: records(TP0, 7, 1)})
    rig.consumer.assigned.clear()
    await rig.worker._retake_fenced()
    assert not rig.worker._fenced and len(rig.producers) == 1


async def test_a_producer_whose_sender_died_is_replaced_and_its_partition_read_again(
    rig: Rig,
) -> None:
    """A broker restart can end aiokafka's sender mid-lookup: its producer then refuses every
    transaction, by assertion. Its replacement's new epoch fences whoever took the partition
    meanwhile, unheard of by a worker paused past its session: what was read before the
    replacement is read again from the offset committed, never committed over theirs."""
    await rig.assign(TP0)
    dead = rig.producer(TP0)
    dead.die(KafkaConnectionError("lost while looking the coordinator up"))
    stale = rig.worker._claim({TP0: records(TP0, 7, 2)})
    rig.consumer._committed[TP0] = 8  # the other owner committed offset 7's event meanwhile
    rig.journal.clear()
    task = await rig.worker.delivery.handle(stale)
    assert task is not None
    await task
    renewed = rig.producer(TP0)
    assert rig.journal == [("stopped", dead.id), ("started", renewed.id), ("committed", "0")]
    assert renewed.committed == [] and renewed.sent == 0 and rig.in_flight() == 0
    assert rig.consumer.positions[TP0] == 8
    await rig.batch({TP0: records(TP0, 8, 1)})
    assert renewed.committed == [{TP0: 9}]


async def test_a_producer_fenced_while_idle_drops_its_partition_without_fencing_back(
    rig: Rig,
) -> None:
    """aiokafka's sender also ends when it hears of the fence between transactions: the
    partition moved, so the worker lets it go rather than start a producer that would fence
    the new owner in turn."""
    await rig.assign(TP0, TP1)
    fenced = rig.producer(TP0)
    fenced.die(ProducerFenced())
    await rig.batch({TP0: records(TP0, 7, 2)})
    assert rig.producer(TP0) is fenced and fenced.stopped and fenced.sent == 0
    assert rig.worker.assignment.partitions == {TP1} and rig.consumer.paused == {TP0}
    assert rig.in_flight() == 0


async def test_what_a_dead_sender_is_read_from_is_on_aiokafkas_producer() -> None:
    """`_sender_error` reads aiokafka's private sender task: an upgrade that moves it fails
    here first, rather than on every transaction."""
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")  # not started
    assert transactional._sender_error(producer) is None


async def test_a_revocation_waits_only_for_the_transactions_of_the_partitions_revoked(
    rig: Rig,
) -> None:
    await rig.assign(TP0, TP1)
    rig.gate.clear()  # TP1's transaction stays open
    open_elsewhere = await rig.deliver({TP1: records(TP1, 3, 2)})
    while not rig.producer(TP1).sent:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(rig.worker.assignment.on_partitions_revoked([TP0]), timeout=1)
    assert rig.producer(TP0).stopped and not rig.producer(TP1).stopped
    rig.gate.set()
    assert open_elsewhere is not None
    await open_elsewhere
    assert rig.producer(TP1).committed == [{TP1: 5}]


async def test_events_of_a_partition_revoked_while_they_were_assembled_are_not_committed(
    rig: Rig,
) -> None:
    await rig.assign(TP0)
    read = rig.worker._claim({TP0: records(TP0, 7, 2)})
    origins = [Origin.from_record(r.message) for r in read]
    entries = rig.worker.delivery.read(list(zip(origins, read, strict=True)))
    outcomes = await rig.runner.process_all([(GOOD, origin) for origin in origins])
    await rig.worker.assignment.on_partitions_revoked([TP0])  # while they were assembled
    await rig.worker.delivery.deliver(entries, [
        (GOOD, origin, outcome) for origin, outcome in zip(origins, outcomes, strict=True)])
    assert rig.producers[0].committed == [] and rig.producers[0].sent == 0
    assert rig.in_flight() == 0, "settled as dropped: their next owner redoes them"
