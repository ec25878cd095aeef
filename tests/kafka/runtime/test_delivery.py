"""The delivery core, once, against a runtime in memory: in-order commits, retries and dead
letters, batch limits, commit rounds, stopping within the grace period, hand-over."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from context_assembler.kafka.records import Origin, OutRecord
from context_assembler.kafka.runtime.delivery import (
    Arrivals,
    CommitRounds,
    Delivery,
    Entry,
    batches,
)
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import ENGINE_BATCH, ENGINE_BATCH_BYTES
from tests.kafka.conftest import make_runner
from tests.kafka.test_records import GOOD

Verdict = Callable[[OutRecord], BaseException | None]


class MemoryRuntime:
    """A Kafka client stack in memory, at least once. Sends are acknowledged by the broker at
    once with `verdict`'s error (None: taken), or, while `hold`, when the test says (`answer`)."""

    transactional = False
    runner: EventRunner  # set by the rig

    def __init__(self, verdict: Verdict = lambda record: None, hold: bool = False) -> None:
        self.verdict = verdict
        self.hold = hold
        self.pending: list[tuple[Origin, asyncio.Future[object]]] = []
        self.taken: list[tuple[Origin, OutRecord]] = []  # by the broker
        self.alone: list[OutRecord] = []  # sent in a producer batch of their own
        self.acknowledged: list[str] = []  # events that may be committed, in order
        self.commits: list[list[str]] = []  # what was acknowledged at each commit
        self.handed: list[str] = []  # records handed to the producer, in order
        self.metadata: dict[str, asyncio.Event] = {}  # a send to a topic here waits for it

    async def send(self, origin: Origin, record: OutRecord) -> asyncio.Future[object]:
        if record.topic in self.metadata:
            await self.metadata[record.topic].wait()
        self.handed.append(f"{origin.offset} {record.topic}")
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if self.hold:
            self.pending.append((origin, future))
        else:
            self._answer(origin, record, future)
        return future

    def _answer(self, origin: Origin, record: OutRecord, future: asyncio.Future[object]) -> None:
        error = self.verdict(record)
        if error is None:
            self.taken.append((origin, record))
            future.set_result(None)
        else:
            future.set_exception(error)

    async def send_alone(self, origin: Origin, record: OutRecord) -> object:
        self.alone.append(record)
        error = self.verdict(record)
        if error is not None:
            raise error
        self.taken.append((origin, record))
        return None

    async def deliver(self, entries: Sequence[Entry[Any]]) -> None:
        await self.runner.deliver_all([entry.event for entry in entries], self.send,
                                      self.send_alone)

    def acknowledge(self, entries: Sequence[Entry[Any]]) -> None:
        self.acknowledged += [entry.token for entry in entries]

    async def commit(self) -> None:
        self.commits.append(list(self.acknowledged))

    async def answer(self, partition: int, offset: int) -> None:
        """The broker acknowledges the records of the event at (partition, offset), its
        prompt and audit, once they were sent."""
        def sent() -> list[asyncio.Future[object]]:
            return [future for origin, future in self.pending
                    if (origin.partition, origin.offset) == (partition, offset)]

        await until(lambda: len(sent()) == 2)
        for future in sent():
            future.set_result(None)

    @property
    def committed(self) -> list[str]:
        return self.commits[-1] if self.commits else []


class Rig:
    def __init__(self, runtime: MemoryRuntime, max_in_flight: int = 100, **settings: object):
        self.runtime = runtime
        self.runner = runtime.runner = make_runner(**settings)
        self.delivery: Delivery[Any] = Delivery(self.runner, runtime, max_in_flight, 0.0)

    async def deliver(self, *events: tuple[int, int]) -> asyncio.Task[None]:
        """Read the events at (partition, offset) as one batch, assemble and deliver them."""
        origins = [Origin("in", partition, offset, b"k", (), 1_700_000_000_000)
                   for partition, offset in events]
        entries = self.delivery.read([(origin, f"{origin.partition}/{origin.offset}")
                                      for origin in origins])
        outcomes = await self.runner.process_all([(GOOD, origin) for origin in origins])
        return self.delivery.deliver(entries, [
            (GOOD, origin, outcome) for origin, outcome in zip(origins, outcomes, strict=True)])


@pytest.fixture
def held() -> Iterator[Rig]:
    rig = Rig(MemoryRuntime(hold=True))
    yield rig
    rig.runner.close()


async def until(condition: Callable[[], bool], seconds: float = 1.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.005)


async def test_an_event_delivered_first_waits_for_the_earlier_ones_of_its_partition(
    held: Rig,
) -> None:
    first = await held.deliver((0, 0))
    second = await held.deliver((0, 1))
    await held.runtime.answer(0, 1)
    await second
    await asyncio.sleep(0.01)
    assert held.runtime.acknowledged == [] and held.runtime.committed == []
    await held.runtime.answer(0, 0)
    await first
    await until(lambda: held.runtime.committed == ["0/0", "0/1"])
    assert held.runtime.acknowledged == ["0/0", "0/1"]


async def test_nothing_is_committed_past_an_undelivered_event_and_partitions_go_on_alone(
    held: Rig,
) -> None:
    await held.deliver((0, 0))
    later = await held.deliver((0, 1), (1, 0))
    await held.runtime.answer(0, 1)
    await held.runtime.answer(1, 0)
    await later
    await until(lambda: held.runtime.committed == ["1/0"])
    await asyncio.sleep(0.02)
    assert held.runtime.acknowledged == ["1/0"]  # 0/1 waits for 0/0, which is not delivered


async def test_batches_hand_their_records_over_in_input_order(held: Rig) -> None:
    held.runtime.metadata["audit"] = asyncio.Event()  # not known yet: its first send waits
    await held.deliver((0, 0))
    await held.deliver((0, 1))
    await asyncio.sleep(0.02)
    assert held.runtime.handed == ["0 prompts"]  # the later batch waits its turn
    held.runtime.metadata["audit"].set()
    await until(lambda: len(held.runtime.handed) == 4)
    assert held.runtime.handed == ["0 prompts", "0 audit", "1 prompts", "1 audit"]


async def test_a_failed_send_is_retried_until_the_broker_takes_it() -> None:
    failures = iter([KafkaTimeoutError()])  # the first send of a prompt times out

    def verdict(record: OutRecord) -> BaseException | None:
        return next(failures, None) if record.topic == "prompts" else None

    rig = Rig(MemoryRuntime(verdict))
    await (await rig.deliver((0, 0)))
    await until(lambda: rig.runtime.committed == ["0/0"])
    assert sorted(record.topic for _, record in rig.runtime.taken) == ["audit", "prompts"]
    assert rig.runner.metrics.retries._value.get() == 1
    rig.runner.close()


async def test_an_output_refused_alone_as_too_large_is_dead_lettered_then_committed() -> None:
    def verdict(record: OutRecord) -> BaseException | None:
        return MessageSizeTooLargeError() if record.topic == "prompts" else None

    rig = Rig(MemoryRuntime(verdict))
    await (await rig.deliver((0, 0)))
    await until(lambda: rig.runtime.committed == ["0/0"])
    assert [record.topic for record in rig.runtime.alone] == ["prompts"]  # tried alone first
    letters = [record for _, record in rig.runtime.taken if record.topic == "dlq"]
    assert [letter.value for letter in letters] == [GOOD]
    rig.runner.close()


def sized(*sizes: int) -> list[tuple[bytes, Origin]]:
    return [(b"x" * size, Origin("in", 0, offset, None, (), None))
            for offset, size in enumerate(sizes)]


def test_engine_batches_end_at_their_count_or_at_their_bytes() -> None:
    by_count = list(batches(sized(*[1] * (ENGINE_BATCH + 3))))
    assert [len(batch) for batch in by_count] == [ENGINE_BATCH, 3]
    half = ENGINE_BATCH_BYTES // 2
    by_bytes = list(batches(sized(half, half, half, 2 * ENGINE_BATCH_BYTES, 1)))
    assert [len(batch) for batch in by_bytes] == [2, 2, 1]  # a batch ends once it is full
    assert [origin.offset for batch in by_bytes for _, origin in batch] == [0, 1, 2, 3, 4]


async def test_a_batch_is_what_arrived_meanwhile_up_to_its_limits_and_none_once_reading_ends(
) -> None:
    arrived: Arrivals[Any] = Arrivals()
    arrived.put(range(ENGINE_BATCH - 2))  # fetches, cut into batches across their ends
    arrived.put(range(100, 105))
    assert await arrived.next_batch(lambda _: 1) == [*range(ENGINE_BATCH - 2), 100, 101]
    assert await arrived.next_batch(lambda _: 1) == [102, 103, 104]
    waiting = asyncio.create_task(arrived.next_batch(lambda _: 1))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # at least one event: it waits for it
    arrived.put([])  # a fetch of nothing held is not an arrival
    await asyncio.sleep(0.01)
    assert not waiting.done()
    arrived.put(["late"])
    assert await asyncio.wait_for(waiting, 1) == ["late"]
    arrived.put(range(2))
    arrived.put([2])
    assert await arrived.next_batch(lambda _: ENGINE_BATCH_BYTES // 2) == [0, 1]  # full
    assert await arrived.next_batch(lambda _: 1) == [2]
    arrived.put(["unhandled"])
    arrived.end()  # reading ended: what is left stays uncommitted
    assert await arrived.next_batch(lambda _: 1) is None


async def test_room_is_taken_a_fetch_at_once_within_the_bound_and_a_larger_one_alone() -> None:
    rig = Rig(MemoryRuntime(hold=True), max_in_flight=4)
    await rig.delivery.room(3)
    waiting = asyncio.create_task(rig.delivery.room(2))
    await asyncio.sleep(0.01)
    assert not waiting.done() and rig.delivery.in_flight == 3  # none of it taken meanwhile
    delivering = await rig.deliver((0, 0), (0, 1))
    await rig.runtime.answer(0, 0)
    await rig.runtime.answer(0, 1)
    await delivering
    await asyncio.wait_for(waiting, 1)
    assert rig.delivery.in_flight == 3  # one left of the first fetch, two of the second
    await rig.deliver((1, 0), (1, 1), (1, 2))
    for offset in range(3):
        await rig.runtime.answer(1, offset)
    await until(lambda: rig.delivery.in_flight == 0)
    await asyncio.wait_for(rig.delivery.room(6), 1)  # more than the bound: once none is
    assert rig.delivery.in_flight == 6
    rig.runner.close()


class GatedCommit:
    """Commits that end when the test says so."""

    def __init__(self) -> None:
        self.started = 0
        self.gate = asyncio.Event()

    async def __call__(self) -> int:
        self.started += 1
        await self.gate.wait()
        self.gate.clear()
        return self.started


async def test_requests_during_a_round_are_answered_by_one_more_round() -> None:
    commit = GatedCommit()
    rounds = CommitRounds(commit, interval=0.02)
    first = rounds.request()
    await until(lambda: commit.started == 1)
    later = [rounds.request() for _ in range(3)]  # one round later takes them all
    assert all(request is later[0] for request in later) and later[0] is not first
    await asyncio.sleep(0.01)
    assert commit.started == 1  # one round at a time
    commit.gate.set()
    assert await asyncio.wait_for(first, 1) == 1
    await until(lambda: commit.started == 2)
    commit.gate.set()
    assert await asyncio.wait_for(later[0], 1) == 2
    await asyncio.sleep(0.05)
    assert commit.started == 2  # nothing requested since: no round
    await rounds.close()


class TimedCommit:
    """Commits that take `seconds` each, noting when each started (the event loop's clock)."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.starts: list[float] = []

    async def __call__(self) -> int:
        self.starts.append(asyncio.get_running_loop().time())
        await asyncio.sleep(self.seconds)
        return len(self.starts)


async def test_rounds_start_at_least_the_interval_apart_and_requests_in_between_share_one(
) -> None:
    commit = TimedCommit()
    rounds = CommitRounds(commit, interval=1.0)  # long: a busy machine cannot blur it
    first = rounds.request()
    await asyncio.sleep(0)
    assert len(commit.starts) == 1  # the first round does not wait
    assert await asyncio.wait_for(first, 5) == 1
    waiting = []
    for _ in range(4):  # within the interval: all in the next round
        waiting.append(rounds.request())
        await asyncio.sleep(0)
    assert all(request is waiting[0] for request in waiting) and len(commit.starts) == 1
    assert await asyncio.wait_for(waiting[0], 5) == 2
    assert commit.starts[1] - commit.starts[0] >= 0.999  # the loop's clock, to its resolution
    await asyncio.sleep(1.05)  # idle past the interval: the next round starts at once
    rounds.request()
    await asyncio.sleep(0)
    assert len(commit.starts) == 3
    await rounds.close()


async def test_a_round_longer_than_the_interval_is_followed_at_once() -> None:
    commit = TimedCommit(seconds=0.3)
    rounds = CommitRounds(commit, interval=0.1)
    first = rounds.request()
    await until(lambda: len(commit.starts) == 1)
    second = rounds.request()
    assert await asyncio.wait_for(first, 1) == 1
    assert len(commit.starts) == 2  # started as the first ended: no wait for the interval
    assert await asyncio.wait_for(second, 1) == 2
    await rounds.close()


async def test_interval_zero_runs_the_rounds_back_to_back() -> None:
    commit = GatedCommit()
    rounds = CommitRounds(commit, interval=0.0)
    first = rounds.request()
    await until(lambda: commit.started == 1)
    second = rounds.request()
    commit.gate.set()
    assert await asyncio.wait_for(first, 1) == 1
    assert commit.started == 2  # started as the first ended
    commit.gate.set()
    assert await asyncio.wait_for(second, 1) == 2
    await rounds.close()


async def test_closing_the_rounds_fails_the_requests_no_round_answered() -> None:
    commit = GatedCommit()
    rounds = CommitRounds(commit)
    first = rounds.request()
    await until(lambda: commit.started == 1)
    second = rounds.request()
    await rounds.close()
    assert first.cancelled() and second.cancelled()


async def test_stop_commits_what_was_delivered_and_gives_up_the_rest_within_grace(
    exits: list[float],
) -> None:
    rig = Rig(MemoryRuntime(hold=True), shutdown_grace_seconds=0.4)
    done = await rig.deliver((0, 0))
    await rig.deliver((0, 1))  # its broker never answers
    await rig.runtime.answer(0, 0)
    await done
    loop = asyncio.get_running_loop()
    started = loop.time()
    await rig.delivery.stop()
    assert 0.15 <= loop.time() - started < 0.35  # cancelled after half the grace period
    assert rig.runtime.committed == ["0/0"]
    assert rig.runtime.acknowledged == ["0/0"]  # 0/1 is redone by the next owner
    await asyncio.sleep(0.3)
    assert exits == [0.4]  # the hard exit stays armed for the end of the grace period
    rig.runner.close()


async def test_a_revoked_partition_waits_for_its_deliveries_under_way_then_commits_them(
    held: Rig,
) -> None:
    await held.deliver((0, 0))
    await held.deliver((0, 1), (1, 0))
    revoking = asyncio.create_task(held.delivery.revoke([("in", 0)], within=5))
    await held.runtime.answer(0, 1)
    await held.runtime.answer(1, 0)
    await asyncio.sleep(0.02)
    assert not revoking.done() and held.runtime.acknowledged == ["1/0"]
    await held.runtime.answer(0, 0)
    await asyncio.wait_for(revoking, 1)
    assert held.runtime.committed == ["1/0", "0/0", "0/1"]


async def test_a_revoked_partition_is_given_up_after_its_bound_with_nothing_undelivered(
) -> None:
    rig = Rig(MemoryRuntime(hold=True), max_in_flight=4)
    for _ in range(4):
        await rig.delivery.room()
    stuck = await rig.deliver((0, 0))  # its broker answers only after the hand-over
    later = await rig.deliver((0, 1), (1, 0))
    delivered = await rig.deliver((0, 2))
    await rig.runtime.answer(0, 2)
    await delivered
    loop = asyncio.get_running_loop()
    started = loop.time()
    await rig.delivery.revoke([("in", 0)], within=0.1)
    assert 0.1 <= loop.time() - started < 0.5
    assert rig.runtime.commits == [[]]  # committed at once, with nothing of partition 0
    for _ in range(3):  # its three events are no longer in flight here
        await asyncio.wait_for(rig.delivery.room(), 0.1)
    await rig.runtime.answer(0, 0)
    await rig.runtime.answer(0, 1)
    await rig.runtime.answer(1, 0)
    await asyncio.gather(stuck, later)
    await until(lambda: rig.runtime.committed == ["1/0"])
    assert rig.runtime.acknowledged == ["1/0"]  # partition 0's are its next owner's
    rig.runner.close()


class MemoryTransactions:
    """A transactional Kafka client stack in memory: nothing is sent before the commit, and
    a commit takes what was acknowledged since the last, ending when the test says so."""

    transactional = True

    def __init__(self) -> None:
        self.acknowledged: list[str] = []
        self.commits: list[list[str]] = []
        self.gate = asyncio.Event()

    async def deliver(self, entries: Sequence[Entry[Any]]) -> None:
        pass

    def acknowledge(self, entries: Sequence[Entry[Any]]) -> None:
        self.acknowledged += [entry.token for entry in entries]

    async def commit(self) -> None:
        taken, self.acknowledged = self.acknowledged, []
        if taken:
            await self.gate.wait()
            self.commits.append(taken)


async def test_a_transactional_delivery_is_committable_once_assembled_and_ends_with_its_round(
) -> None:
    runtime = MemoryTransactions()
    rig = Rig(runtime, max_in_flight=2)  # type: ignore[arg-type]
    for _ in range(2):
        await rig.delivery.room()
    delivering = await rig.deliver((0, 0), (1, 0))
    await until(lambda: runtime.acknowledged == [] and not runtime.commits)
    await asyncio.sleep(0.01)
    assert not delivering.done() and rig.delivery.in_flight == 2  # until its round commits
    runtime.gate.set()
    await asyncio.wait_for(delivering, 1)
    assert runtime.commits == [["0/0", "1/0"]] and rig.delivery.in_flight == 0
    rig.runner.close()
