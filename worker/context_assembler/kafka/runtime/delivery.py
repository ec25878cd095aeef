"""The delivery core both runtimes drive: what is in flight, what may be committed, when.

A runtime (faust for at_least_once, aiokafka's transactions for exactly_once) reads events,
sends records and commits offsets; the rules of when are here, written and tested once:

- `InOrder`: the events read and not yet committed, per input partition, in read order. An
  offset may be committed only once its event and every event read before it on its
  partition are settled: a later event settled first waits for the earlier. A revoked
  partition hands over what was settled and forgets the rest, which its next owner redoes.
- `batches` and `Arrivals`: events go to the engine in batches of at most ENGINE_BATCH
  events and ENGINE_BATCH_BYTES of input.
- `CommitRounds`: commits run one at a time; a round takes everything that became
  committable before it began, so commits never overlap and never wait for later work, and
  starts no sooner than the commit interval after the previous one started.
- `hand_over`: a revoked partition is given up once its deliveries under way ended, or after
  a bound (the session timeout), so that its next owner reads from what they committed.
- `Delivery`: one loop over a `Runtime`, as an HTTP client over its transport: batches read,
  assembled in order and delivered as tasks of the runner (retried, dead-lettered, cancelled
  on stop within the grace period), acknowledged in order, committed in rounds, handed over
  on revocation. The guarantee changes two steps of it, both the commit's: at_least_once
  sends an event's records first and commits its offset once the broker took them;
  exactly_once sends them in the commit itself, one transaction with the offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from context_assembler.kafka.records import Origin, Outcome, value_of
from context_assembler.kafka.runtime.retries import Stopped
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import ENGINE_BATCH, ENGINE_BATCH_BYTES

log = logging.getLogger(__name__)
Partition = tuple[str, int]  # an input topic and partition
T = TypeVar("T")
R = TypeVar("R")
Assembled = tuple[bytes, Origin, Outcome]  # an event, and what the engine made of it


class Read(Protocol):
    """A runtime's handle on an event read: its Kafka record is `message`."""

    @property
    def message(self) -> Any: ...


Token = TypeVar("Token", bound=Read)


@dataclass(eq=False)
class Entry(Generic[T]):
    """One event read: where it came from, the runtime's handle on it, what the engine made
    of it, whether settled (ready to commit), whether forgotten (handed over undelivered)."""

    partition: Partition
    offset: int
    token: T
    assembled: Assembled | None = None
    settled: bool = False
    forgotten: bool = False

    @property
    def event(self) -> Assembled:
        assert self.assembled is not None, "read, not assembled yet"
        return self.assembled


class InOrder(Generic[T]):
    """The events read and not yet committable, per input partition, in read order."""

    def __init__(self) -> None:
        self._partitions: dict[Partition, deque[Entry[T]]] = {}

    def read(self, events: Sequence[tuple[Origin, T]]) -> list[Entry[T]]:
        """Track the events read, in order; each stays in flight until `settle`d."""
        entries = [Entry((origin.topic, origin.partition), origin.offset, token)
                   for origin, token in events]
        for partition, its in groupby(entries, key=attrgetter("partition")):  # a fetch's runs
            self._partitions.setdefault(partition, deque()).extend(its)
        return entries

    def settle(self, entries: Iterable[Entry[T]]) -> None:
        """The entries' events were delivered (an entry of a revoked partition is ignored)."""
        for entry in entries:
            entry.settled = True

    def take_settled(self) -> list[Entry[T]]:
        """The entries that became committable, in read order per partition: each partition's
        settled entries up to its first unsettled one. They are no longer tracked."""
        taken = []
        for entries in self._partitions.values():
            while entries and entries[0].settled:
                taken.append(entries.popleft())
        return taken

    def revoke(self, partitions: Iterable[Partition]) -> list[Entry[T]]:
        """Forget the partitions: their committable entries are returned, for a last commit;
        the others are never committed here, and their next owner redoes them."""
        taken = []
        for partition in partitions:
            entries = self._partitions.pop(partition, deque())
            while entries and entries[0].settled:
                taken.append(entries.popleft())
            for entry in entries:
                entry.forgotten = True
            if entries:
                log.info("%s/%d handed over with %d events undelivered here, from offset %d: "
                         "its next owner redoes them", *partition, len(entries), entries[0].offset)
        return taken

    @property
    def in_flight(self) -> int:
        return sum(len(entries) for entries in self._partitions.values())


def batches(events: Sequence[tuple[bytes, Origin]]) -> Iterator[Sequence[tuple[bytes, Origin]]]:
    """The events in engine batches, in order: each ends at ENGINE_BATCH events or at the
    event that brings its input to ENGINE_BATCH_BYTES, whichever comes first."""
    start = 0
    while start < len(events):
        end, size = start, 0
        while end < len(events) and end - start < ENGINE_BATCH and size < ENGINE_BATCH_BYTES:
            size += len(events[end][0])
            end += 1
        yield events[start:end]
        start = end


class Arrivals(Generic[T]):
    """The events read and not yet taken for the engine: the reader puts them as it reads
    them (a fetch at once: one queue item, not one an event), the loop takes them in engine
    batches (`next_batch`)."""

    def __init__(self) -> None:
        self._reads: asyncio.Queue[Sequence[T] | None] = asyncio.Queue()  # None: reading ended
        self._left: list[T] = []  # arrived, not in a batch yet

    def put(self, events: Sequence[T]) -> None:
        if events:
            self._reads.put_nowait(events)

    def end(self) -> None:
        """Reading ended: what was read but not taken stays uncommitted."""
        self._reads.put_nowait(None)

    async def next_batch(self, size: Callable[[T], int]) -> list[T] | None:
        """The events that arrived while the last batch was handled, as `batches` cuts them
        (at least one, waiting for it), or None once reading ended. No timer: a batch never
        waits for more events than are there."""
        if not self._left:
            read = await self._reads.get()
            if read is None:
                return None
            self._left = list(read)
        while not self._reads.empty():
            read = self._reads.get_nowait()
            if read is None:
                return None
            self._left += read
        end, total = 0, 0
        for end, event in enumerate(self._left, 1):
            total += size(event)
            if end >= ENGINE_BATCH or total >= ENGINE_BATCH_BYTES:
                break
        batch, self._left = self._left[:end], self._left[end:]
        return batch


class CommitRounds(Generic[R]):
    """Runs `commit` one round at a time, each round answering every request made before it
    began. A round starts no sooner than `interval` seconds after the previous one started,
    so requests in between share one round; one that took longer is followed at once, so
    under load nothing waits for the interval."""

    def __init__(self, commit: Callable[[], Awaitable[R]], interval: float = 0.0) -> None:
        self._commit = commit
        self._interval = interval
        self._next: asyncio.Future[R] | None = None  # the next round's outcome
        self._rounds: asyncio.Task[None] | None = None
        self._last_start = -math.inf  # the event loop's clock

    def request(self) -> asyncio.Future[R]:
        """A round will begin after this; its outcome, or its error. Cancelling the
        future returned does not cancel the round: other requests share it."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        if self._rounds is None or self._rounds.done():
            self._rounds = asyncio.create_task(self._run())
        return self._next

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._next is not None:
                wait = self._last_start + self._interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                self._last_start = loop.time()
                answered, self._next = self._next, None
                try:
                    result = await self._commit()
                except BaseException as error:
                    _fail(answered, error)
                    raise
                if not answered.done():
                    answered.set_result(result)
        except BaseException as error:
            if self._next is not None:
                _fail(self._next, error)
                self._next = None
            raise

    async def close(self) -> None:
        """Cancel the rounds; a round in progress ends as its commit does on cancellation."""
        if self._rounds is not None:
            self._rounds.cancel()
            await asyncio.gather(self._rounds, return_exceptions=True)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """End `future` as `error` ended what it stood for."""
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)


async def hand_over(under_way: Callable[[], set[asyncio.Task[Any]]], within: float) -> None:
    """Wait for the deliveries `under_way` names to end, `within` seconds at most, before
    revoked partitions are given up: their next owner reads from what those commit. One
    stuck past that (on a failing broker) ends by its own error path, uncommitted, and its
    events are redone by the next owner."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while pending := under_way():
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.warning("giving partitions up with %d deliveries still under way after %.0fs; "
                        "their next owner redoes what those do not commit", len(pending), within)
            return
        await asyncio.wait(pending, timeout=remaining)


class Runtime(Protocol[Token]):
    """A Kafka client stack's side of delivery, as a transport is an HTTP client's: how an
    event's records reach the broker and how its offset is committed."""

    transactional: bool
    """True: the records go out in the commit, one transaction with the offsets (exactly_once).
    False: they go out first, and the commit follows the broker's acknowledgement."""

    async def deliver(self, entries: Sequence[Entry[Token]]) -> None:
        """Before the entries may be committed: send their records until the broker took
        them, or leave them to the commit."""

    def acknowledge(self, entries: Sequence[Entry[Token]]) -> None:
        """The entries, in read order per partition, may be committed."""

    async def commit(self) -> object:
        """Commit what was acknowledged."""


class Delivery(Generic[Token]):
    """Batches assembled in read order and delivered concurrently, acknowledged and committed
    strictly in input order per partition, at most `max_in_flight` events unacknowledged."""

    def __init__(self, runner: EventRunner, runtime: Runtime[Token], max_in_flight: int,
                 commit_interval: float) -> None:
        self.runner = runner
        self._runtime = runtime
        self._ledger: InOrder[Token] = InOrder()
        self._max_in_flight = max_in_flight
        self.in_flight = 0  # events read past `room` and not yet acknowledged or forgotten
        self._freed = asyncio.Event()  # set as events leave the flight
        self._rounds: CommitRounds[object] = CommitRounds(runtime.commit, commit_interval)
        self._deliveries: dict[asyncio.Task[None], set[Partition]] = {}  # running

    async def room(self, events: int = 1) -> None:
        """Wait until `events` more may be read, a fetch at once: at most max_in_flight in
        flight (more only if none is)."""
        while self.in_flight and self.in_flight + events > self._max_in_flight:
            self._freed.clear()
            await self._freed.wait()
        self.in_flight += events

    async def assemble(self, arrived: Arrivals[Token]) -> None:
        """The loop: the events that `arrived` (each after its `room`) go to the engine in
        batches (`Arrivals.next_batch`), in order, and each batch is delivered as a task.
        Returns once reading ended or the worker is stopping."""
        while (tokens := await arrived.next_batch(_size)) is not None:
            if await self.handle(tokens) is None:
                return

    async def handle(self, tokens: Sequence[Token]) -> asyncio.Task[None] | None:
        """Track, assemble and deliver the events read; None once the worker is stopping:
        they stay unacknowledged, so never committed, and are redone once by their next
        owner."""
        read_now = [(Origin.from_record(token.message), token) for token in tokens]
        entries = self.read(read_now)
        inputs = [(value_of(token.message), origin) for origin, token in read_now]
        outcomes: list[Outcome] = []
        with contextlib.suppress(Stopped):  # stopped waiting for the schema registry
            outcomes = await self.runner.process_all(inputs)
        if self.runner.stopping.is_set():
            return None
        return self.deliver(entries, [(raw, origin, outcome) for (raw, origin), outcome
                                      in zip(inputs, outcomes, strict=True)])

    def read(self, events: Sequence[tuple[Origin, Token]]) -> list[Entry[Token]]:
        """Track the events read, in order, each after its `room`; they are in flight until
        acknowledged or handed over."""
        return self._ledger.read(events)

    def deliver(self, entries: list[Entry[Token]],
                events: Sequence[Assembled]) -> asyncio.Task[None]:
        """Deliver the events' outcomes as one task of the runner (cancelled on stop once half
        the grace period is over), then acknowledge the events that became committable."""
        for entry, event in zip(entries, events, strict=True):
            entry.assembled = event
        task = self.runner.spawn(self._deliver(entries))
        self._deliveries[task] = {entry.partition for entry in entries}
        task.add_done_callback(self._delivered)
        return task

    async def _deliver(self, entries: list[Entry[Token]]) -> None:
        await self._runtime.deliver(entries)
        self._ledger.settle(entries)
        committable = self._ledger.take_settled()
        if not self._runtime.transactional:
            for entry in entries:
                entry.assembled = None  # delivered: not held while earlier events are not
            self._acknowledge(committable)  # committed by a later round
            return
        # The records go out in the round's transactions: in flight until it ended.
        self._runtime.acknowledge(committable)
        try:  # shielded: one delivery cancelled does not stop a round
            await asyncio.shield(self._rounds.request())
        finally:
            self._leave(len(committable))

    def _delivered(self, task: asyncio.Task[None]) -> None:
        del self._deliveries[task]
        if task.cancelled():
            return  # stopping: never acknowledged, redone by the partitions' next owner
        error = task.exception()
        if error is not None and not isinstance(error, Stopped):
            log.error("delivery failed; no later event of its partitions is acknowledged: "
                      "%r", error, exc_info=error)

    def _acknowledge(self, entries: list[Entry[Token]]) -> None:
        if not entries:
            return
        self._runtime.acknowledge(entries)
        self._leave(len(entries))
        if not self.runner.stopping.is_set():  # then the last commit is `stop`'s
            self._rounds.request()

    def _leave(self, events: int) -> None:
        """That many events are no longer in flight here."""
        self.in_flight -= events
        self._freed.set()

    async def revoke(self, partitions: Iterable[Partition], within: float) -> None:
        """Hand the partitions over: wait for their deliveries under way (`hand_over`), then
        acknowledge and commit what was delivered of them; what was not is never
        acknowledged here, and their next owner redoes it."""
        revoked = set(partitions)
        under_way = {task for task, touched in self._deliveries.items() if touched & revoked}
        await hand_over(lambda: {task for task in under_way if not task.done()}, within)
        before = self._ledger.in_flight
        delivered = self._ledger.revoke(revoked)
        self._leave(before - self._ledger.in_flight - len(delivered))  # forgotten
        self._acknowledge(delivered)
        if not self._runtime.transactional:  # else their rounds committed, `hand_over` waited
            await self._runtime.commit()

    async def stop(self) -> None:
        """Stop the runner's retries, and once the deliveries ended (delivered, or cancelled
        after half the grace period): commit every event delivered. What is left is redone
        by the partitions' next owner."""
        self.runner.stop()
        await self.runner.drained()
        await self._rounds.close()
        await self._runtime.commit()

    async def close(self) -> None:
        await self._rounds.close()


def _size(token: Read) -> int:
    return len(token.message.value or b"")
