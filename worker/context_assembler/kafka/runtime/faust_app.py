"""At-least-once delivery on faust-streaming: faust's side of `delivery.Delivery`.

An input offset may be committed only after the prompt and the audit (or the dead letter)
are acknowledged by the broker. faust commits what was acked; it acks an event when its
agent moves on or raises, and with concurrency > 1 it can commit past an event still in
flight (bench/README.md, "Lore moved from the code"). So the agent reads a manual-ack
stream (`noack`), never raises for one event (bad input is an outcome, a failed send is
retried until it is acknowledged), and leaves acks and commits to the delivery core: in
input order per partition, in commit rounds at least the commit interval apart
(ASSEMBLER_COMMIT_INTERVAL_MS, 30 ms unless set), so a kill -9 redoes only what was
delivered during that interval and a commit round trip, not faust's timer's second of
events, each a duplicate LLM call downstream.

The events that arrived while the last batch was assembled go to the engine in one call
(`delivery.Arrivals`) and are delivered as one task, their records handed to faust's
producer at once to share its batches (1 MiB, 5 ms linger). A record the broker refuses as
too large may only have shared a batch over the topic's limit: it is sent again alone
(`_LoneProducer`).

faust's consumer feeds the agent's stream as fast as the engine reads it: a message handed
over to the stream is raced against a rebalance only when it has to wait for room
(`_Consumer.wait_first`), and a full stream holds the fetching back instead of stopping it
for a nap of a second (`_Consumer.on_buffer_full`).

The faust internals this adapter relies on, each marked "faust-streaming 0.15.3" where it
is used, are checked to exist by tests/kafka/runtime/test_faust_app.py, so an upgrade that drops
one fails there first.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Generic, TypeVar, cast

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import UnsupportedCodecError
from faust.tables import TableManager
from faust.transport.consumer import RecordMap
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT
from faust.types.transports import TransportT
from mode.services import WaitResults

from context_assembler.collector import collect_less
from context_assembler.kafka.batches import read_ahead, record_bytes
from context_assembler.kafka.clients import KafkaClients, faust_client_config
from context_assembler.kafka.records import Origin, OutRecord
from context_assembler.kafka.runtime.delivery import Arrivals, Delivery, Entry
from context_assembler.kafka.runtime.membership import leave_on_stop
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import (
    MAX_IN_FLIGHT,
    PRODUCER_REQUEST_TIMEOUT_SECONDS,
    READ_AHEAD_WAIT_SECONDS,
    STREAM_BUFFER_EVENTS,
    TIMER_COMMIT_SECONDS,
)
from context_assembler.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
# The services subclassed here log their own start and stop ("[^--_Consumer]: Starting...",
# a dozen lines a run) under the module of the subclass; under faust's name they are as quiet
# as faust's other services (observability.logs), and this module's lines are ours alone.
SERVICE_LOG = logging.getLogger("faust.services")

# False: only the timer commits, as before (bench.interval_commits measures against it).
COMMIT_ON_DELIVERY = True


def _app_config(settings: Settings, runner: EventRunner, datadir: str) -> dict[str, Any]:
    """faust's settings for this app: `datadir` is a directory faust insists on, though this
    app keeps no state there; the caller removes it at exit."""
    return dict(
        **faust_client_config(settings, runner.batch_bytes),
        key_serializer="raw",
        value_serializer="raw",
        processing_guarantee="at_least_once",
        broker_commit_interval=max(TIMER_COMMIT_SECONDS, settings.commit_interval_seconds),
        topic_disable_leader=True,  # no extra "<app>-__assignor-__leader" topic
        # No tables, so no standbys. faust's default (1) also keeps its sticky assignor from
        # taking partitions off a worker holding ceil(partitions / workers), so a worker
        # joining could get none, for good. With 0 it balances to the floor.
        table_standby_replicas=0,
        TableManager=_Tableless,
        topic_allow_declare=False,  # topics are created by operations, not by the worker
        web_enabled=False,  # our own /metrics, /health, /ready (observability/http.py)
        # faust would wait, on a rebalance and on stop, for every event it handed out to be
        # acked, with no bound, and sends failing never end: the delivery core waits instead
        # (`Delivery.revoke`, `Delivery.stop`), bounded, for what the hand-over needs.
        stream_wait_empty=False,
        stream_buffer_maxsize=STREAM_BUFFER_EVENTS,
        autodiscover=False,
        datadir=datadir,
    )


def build_app(settings: Settings, runner: EventRunner, datadir: str) -> _App:
    """The at_least_once worker: one agent reading the input topic in batches for the
    delivery core."""
    app = _App(settings.group_id, **_app_config(settings, runner, datadir))
    app.runner = runner
    source = app.topic(settings.input_topic, key_type=bytes, value_type=bytes)

    runtime = _FaustRuntime(app, settings, runner)
    delivery = app.delivery = Delivery(runner, runtime, MAX_IN_FLIGHT,
                                        settings.commit_interval_seconds)

    @app.agent(source, concurrency=1)
    async def assemble(stream: faust.StreamT[bytes]) -> None:
        collect_less()  # faust, its consumer and producer are up: freeze what they made
        arrived: Arrivals[EventT[bytes]] = Arrivals()

        async def read() -> None:
            try:
                manual_acks = stream.noack()  # type: ignore[attr-defined]  # on Stream only
                async for event in manual_acks.events():
                    await delivery.room()
                    arrived.put((event,))
            finally:
                arrived.end()

        reading = asyncio.create_task(read())
        try:
            await delivery.assemble(arrived)
            if runner.stopping.is_set():
                await asyncio.get_running_loop().create_future()  # until faust cancels it
            await reading  # it ended: raise its error, if any
        finally:
            reading.cancel()
            await delivery.close()
            await runtime.close()

    return app


class _FaustRuntime:
    """The faust side of `Delivery`: faust's producer sends, acks mark events committable,
    faust's consumer commits what was acked (only offsets below every unacked one)."""

    transactional = False

    def __init__(self, app: faust.App, settings: Settings, runner: EventRunner) -> None:
        self._app = app
        self._runner = runner
        self._lone = _LoneProducer(settings)
        self._committing = asyncio.Lock()

    async def send(self, origin: Origin, record: OutRecord) -> Awaitable[object]:
        return await self._app.producer.send(
            record.topic, record.key, record.value, None, seconds(origin.timestamp_ms),
            list(record.headers),
        )

    async def send_alone(self, origin: Origin, record: OutRecord) -> None:
        await self._lone.send(origin, record)

    async def deliver(self, entries: Sequence[Entry[EventT[bytes]]]) -> None:
        await self._runner.deliver_all([entry.event for entry in entries], self.send,
                                       self.send_alone)

    def acknowledge(self, entries: Sequence[Entry[EventT[bytes]]]) -> None:
        for entry in entries:
            entry.token.ack()

    async def commit(self) -> None:
        """Commit what was acked. Shielded: a commit cancelled midway loses its offsets from
        faust's books, and every later commit of their partitions with them (a gap faust
        never closes)."""
        if COMMIT_ON_DELIVERY:
            await asyncio.shield(self._commit_after_any_in_progress())

    async def _commit_after_any_in_progress(self) -> None:
        # faust-streaming 0.15.3: a commit called while another is in progress (faust's
        # timer's, say) only waits for it, and that one may predate the latest acks.
        async with self._committing:
            consumer = cast(faust_aiokafka.Consumer, self._app.consumer)
            await consumer.maybe_wait_for_commit_to_finish()
            await consumer.commit()

    async def close(self) -> None:
        await self._lone.stop()


class _LoneProducer:
    """Sends a record refused as too large once more, in a batch of its own: faust's
    producer batches records, and the broker refuses a batch over a topic's limit as if
    its every record were too large (`Retries.forever`). Started on first use."""

    def __init__(self, settings: Settings) -> None:
        self._clients = KafkaClients.of(settings)
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def send(self, origin: Origin, record: OutRecord) -> None:
        async with self._starting:
            if self._producer is None:
                producer = self._clients.producer(
                    # Not idempotent: a refused record would still count in the sequence, and
                    # the broker would refuse every later send as out of order.
                    enable_idempotence=False,
                    max_batch_size=1,  # no second record fits
                    request_timeout_ms=int(PRODUCER_REQUEST_TIMEOUT_SECONDS * 1000),
                )
                try:
                    await producer.start()
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
        await self._producer.send_and_wait(
            record.topic, record.value, record.key, timestamp_ms=origin.timestamp_ms,
            headers=list(record.headers))

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()


class _Consumer(faust_aiokafka.Consumer):
    """faust's consumer, handing revoked partitions over (`Delivery.revoke`) before faust
    forgets them."""

    logger = SERVICE_LOG

    # faust-streaming 0.15.3 drops the acked, uncommitted offsets of revoked partitions
    # first thing here, and their next owner would redo those events: commit them before.
    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        delivery: Delivery[EventT[bytes]] = self.app.delivery  # type: ignore[attr-defined]
        if COMMIT_ON_DELIVERY:
            await delivery.revoke({(tp.topic, tp.partition) for tp in revoked},
                                  self.app.conf.broker_session_timeout)
        await super().on_partitions_revoked(revoked)

    # faust-streaming 0.15.3 makes each message it hands to the streams here.
    def _to_message(self, tp: TP, record: Any) -> Any:
        """faust's message of `record`, its bytes counted in the read-ahead until it is
        freed (kafka.batches.ReadAhead): faust copies the record's fields and drops it."""
        message = super()._to_message(tp, record)
        read_ahead.track(message, record_bytes(record))
        return message

    # faust-streaming 0.15.3 stops fetching a partition whose stream is 4/5 full, until it
    # drains to 2/5; with every partition stopped, its fetcher sleeps a whole second.
    def on_buffer_full(self, tp: TP) -> None:
        """Fetching goes on: the one stream's bound holds the read-ahead, since a message
        handed over to a full stream waits for room (and that wait ends on a rebalance, as
        `wait_first` races it). Stopped by pressure, the fetcher napped a second at a time
        while the agent drained its stream in a fraction of it: reading went at about half
        the speed."""

    # faust-streaming 0.15.3's fetcher hands each message to the conductor as
    # `self.wait_first(callback(message), self.suspend_flow.wait())`, its one call here.
    async def wait_first(self, *coros: Any, timeout: Any = None) -> WaitResults:
        """A message's hand-over to the agent's stream, raced as faust races it but only
        when it has to wait. faust starts four tasks and an asyncio.wait for every message
        (CPU the engine would rather have), so that a hand-over stuck on a full stream ends
        when a rebalance suspends the flow. Nearly every hand-over finds room and ends
        without waiting: it runs here, and only one that waits goes on in a task raced
        against the suspension."""
        if not self._is_hand_over(coros, timeout):
            return await super().wait_first(*coros, timeout=timeout)
        handing, suspended = coros
        try:
            awaited = handing.send(None)
        except StopIteration as done:
            suspended.close()
            return WaitResults([handing], [done.value], False)
        except BaseException:
            suspended.close()
            raise
        rest = asyncio.ensure_future(_Resumed(handing, awaited))
        return await super().wait_first(rest, suspended)

    def _is_hand_over(self, coros: tuple[Any, ...], timeout: Any) -> bool:
        """Whether `coros` are a message's hand-over and a wait for the flow's suspension."""
        if timeout is not None or len(coros) != 2 or not all(map(inspect.iscoroutine, coros)):
            return False
        return bool(inspect.getcoroutinelocals(coros[1]).get("self") is self.suspend_flow)

    # faust-streaming 0.15.3 makes its consumer thread here, with no setting to choose its
    # class: the only way to install `_ConsumerThread`.
    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Leaves the group when stopped, static member or not (kafka.runtime.membership)."""

    logger = SERVICE_LOG

    # faust-streaming 0.15.3 keeps its aiokafka consumer in `_consumer`; a static member
    # stays in the group on stop unless told to leave (membership.leave_on_stop).
    async def on_thread_stop(self) -> None:
        leave_on_stop(self._consumer)
        await super().on_thread_stop()

    # faust-streaming 0.15.3's fetcher crashes on a batch it cannot decode, and a restarted
    # worker on the same batch: `_fetch_records` is where every fetch passes.
    async def _fetch_records(
        self, consumer: AIOKafkaConsumer, active_partitions: set[TP],
        timeout: float | None = None, max_records: int | None = None,
    ) -> RecordMap:
        """Fetched records; none, for good, once a batch could not be decoded: faust's
        fetcher crashed on it, and a restarted worker on the same batch. No retry: records
        of other partitions fetched in the same call are lost with the error, and faust,
        seeing later offsets, would take them for a gap and commit past them."""
        runner: EventRunner = self.app.runner  # type: ignore[attr-defined]  # on _App only
        if read_ahead.full and self.app.delivery.in_flight:  # type: ignore[attr-defined]
            # The records read and alive hold the bound: those in flight go first. With
            # none in flight, what holds them is done with them (the last event read, say).
            await asyncio.sleep(READ_AHEAD_WAIT_SECONDS)
            return {}
        if runner.undecodable is None:
            try:
                return await super()._fetch_records(consumer, active_partitions, timeout,
                                                    max_records)
            except UnsupportedCodecError as error:
                runner.cannot_decode(error)
        await asyncio.sleep(timeout or 0)  # faust asks again at once
        return {}


class _Resumed(Generic[T]):
    """A coroutine suspended on `awaited`, awaitable again: the task awaiting this waits for
    `awaited`, and what it sends or throws in then goes on to the coroutine."""

    def __init__(self, coroutine: Coroutine[Any, Any, T], awaited: object) -> None:
        self._coroutine = coroutine
        self._awaited = awaited

    def __await__(self) -> Generator[Any, Any, T]:
        coroutine, awaited = self._coroutine, self._awaited
        while True:
            try:
                sent = yield awaited
            except BaseException as error:  # cancelled, say: the coroutine handles it
                step: Callable[[Any], Any] = coroutine.throw
                value: Any = error
            else:
                step, value = coroutine.send, sent
            try:
                awaited = step(value)
            except StopIteration as done:
                return cast(T, done.value)


class _Tableless(TableManager):
    """faust's table manager without its start-up nap: it sleeps a second before anything
    else, presumably for tables to register, and a restarted replica's partitions waited it
    out. This app declares no tables."""

    logger = SERVICE_LOG

    # faust-streaming 0.15.3's TableManager.on_start: its nap, then these two steps.
    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class _App(faust.App):
    logger = SERVICE_LOG
    runner: EventRunner  # its consumer thread reports undecodable input there
    delivery: Delivery[EventT[bytes]]  # its consumer hands revoked partitions over there

    # faust-streaming 0.15.3 picks its transport by the broker URL's scheme, with no setting
    # to choose the consumer's class: the only way to install `_Consumer`.
    def _new_transport(self) -> TransportT:
        return _Transport(self.conf.broker_consumer, self)


def seconds(timestamp_ms: int | None) -> float | None:
    """A timestamp as faust's send takes it: seconds, which it turns back into milliseconds
    with `int(seconds * 1000.0) if seconds else seconds`. Half a millisecond more (away from
    zero) survives that truncation, where timestamp_ms / 1000 comes back 1 ms short for
    some values (in 2038-39, for one), and 0 stays an int (faust passes 0.0 on as a float)."""
    if timestamp_ms is None:
        return None
    return (timestamp_ms + (0.5 if timestamp_ms >= 0 else -0.5)) / 1000


class FaustWorker(faust.Worker):
    """faust's worker, stopping within the grace period even while sends fail: the
    deliveries end and what they delivered is committed first (`Delivery.stop`), then faust
    stops; the events left unacked are the partitions' next owner's to redo."""

    logger = SERVICE_LOG

    def __init__(self, app: _App, loglevel: str) -> None:
        super().__init__(app, loglevel=loglevel, override_logging=False, quiet=True)
        self._delivery = app.delivery
        self._stopping: asyncio.Task[None] | None = None

    # faust-streaming 0.15.3 (mode-streaming's Worker) installs `_on_sigterm` and
    # `_on_sigint` here; each is called once the deliveries ended instead.
    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()
        for sig, stop in ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint)):
            self.loop.add_signal_handler(sig, self._end_deliveries_then, stop)

    def _end_deliveries_then(self, stop: Callable[[], None]) -> None:
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_after_deliveries(stop))

    async def _stop_after_deliveries(self, stop: Callable[[], None]) -> None:
        await self._delivery.stop()
        stop()
