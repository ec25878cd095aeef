"""At-least-once delivery on faust-streaming.

An input offset may be committed only after the prompt and the audit (or the dead letter)
are acknowledged by the broker. faust commits what was acked; it acks an event when its
agent moves on or raises (faust-streaming #315), and with concurrency > 1 it can commit
past an event still in flight (#606). So the agent reads a manual-ack stream (`noack`),
never raises for one event (bad input is an outcome, a failed send is retried until it is
acknowledged), and acks strictly in input order: an event is acked once its own records
and those of every event before it are acknowledged. The next events are assembled while
earlier ones are still being delivered, at most MAX_IN_FLIGHT at a time.

Batches: the events that arrived while the last batch was assembled (up to ENGINE_BATCH)
go to the engine thread in one call and are delivered as one task, their records handed to
the producer at once to share its batches (1 MiB, 5 ms linger); the batch is acked, in
order, once all of them are acknowledged. A record the broker refuses as too large may
only have shared a batch over the topic's limit: it is sent again alone (`_LoneProducer`).

Stopping: faust waits for every event it handed out to be acked before it commits and leaves
the group (`stream_wait_empty`), which never happens while sends fail: SIGTERM was ignored.
So `FaustWorker` first ends the deliveries (EventRunner.stop: no more retries, cancelled
after half the grace period), then tells faust not to wait for the events left unacked,
which the partitions' next owner redoes.

Committing: every in-order ack requests a commit, run one at a time, the next at most
COMMIT_GAP_SECONDS after the last ends (batching the acks meanwhile); so a kill -9 redoes
only what was delivered during that gap and a commit round trip, where faust's timer
(broker_commit_interval, 1 s) redid up to a second of events, each a duplicate LLM call
downstream. On SIGTERM `FaustWorker` commits every delivered event before faust leaves the
group, and `_Consumer` commits them before a rebalance takes partitions away (faust forgets
acked, uncommitted offsets of revoked partitions first thing).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections import deque
from collections.abc import Awaitable, Callable

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import UnsupportedCodecError
from faust.tables import TableManager
from faust.transport.consumer import RecordMap
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT
from faust.types.transports import TransportT

from context_assembler.kafka.connection import kafka_security
from context_assembler.kafka.membership import HEARTBEAT_INTERVAL_SECONDS, leave_on_stop
from context_assembler.kafka.records import Origin, OutRecord, value_of
from context_assembler.kafka.runner import (
    ENGINE_BATCH,
    PRODUCER_LINGER_MS,
    EventRunner,
    Stopped,
    collect_less,
)
from context_assembler.settings import Settings

log = logging.getLogger(__name__)
# The services subclassed here log their own start and stop ("[^--_Consumer]: Starting...",
# a dozen lines a run) under the module of the subclass; under faust's name they are as quiet
# as faust's other services (observability.logs), and this module's lines are ours alone.
SERVICE_LOG = logging.getLogger("faust.services")

MAX_IN_FLIGHT = 200
# aiokafka's default: a send to a missing topic fails (and is logged) after this long,
# where faust's default (20 minutes) would hang silently.
REQUEST_TIMEOUT_SECONDS = 40.0
# faust's timer commit; only a backstop now, commits follow deliveries (`_commit_delivered`).
COMMIT_INTERVAL_SECONDS = 1.0
# Commits follow deliveries at most this often: a commit per ack cost about 15 % of the
# throughput on 2 cores; this bounds what a kill -9 redoes to rate x (gap + round trip).
COMMIT_GAP_SECONDS = 0.03
# False: only the timer commits, as before (bench.interval_commits measures against it).
COMMIT_ON_DELIVERY = True


def build_app(settings: Settings, runner: EventRunner, datadir: str) -> faust.App:
    """`datadir`: a directory faust insists on, though this app keeps no state there; the
    caller removes it at exit."""
    servers = [f"kafka://{server.strip()}" for server in settings.bootstrap_servers.split(",")]
    app = _App(
        settings.group_id,
        broker=servers,
        broker_credentials=kafka_security(settings).faust_credentials(),
        key_serializer="raw",
        value_serializer="raw",
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_max_request_size=settings.max_message_bytes,
        producer_request_timeout=REQUEST_TIMEOUT_SECONDS,
        producer_max_batch_size=runner.batch_bytes,
        producer_linger=PRODUCER_LINGER_MS / 1000,
        producer_compression_type=settings.producer_compression,
        broker_commit_interval=COMMIT_INTERVAL_SECONDS,
        # A killed replica holds its partitions until this runs out (faust's default: 60 s).
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=HEARTBEAT_INTERVAL_SECONDS,  # a rebalance heard within 1 s
        consumer_group_instance_id=settings.group_instance_id,  # static membership if set
        topic_disable_leader=True,  # no extra "<app>-__assignor-__leader" topic
        # No tables, so no standbys. faust's default (1) also keeps its sticky assignor from
        # taking partitions off a worker holding ceil(partitions / workers): a 4th worker
        # joining 3 on 6 partitions got none, for good. With 0 it balances to the floor.
        table_standby_replicas=0,
        TableManager=_Tableless,
        topic_allow_declare=False,  # topics are created by operations, not by the worker
        web_enabled=False,  # our own /metrics, /health, /ready (observability/http.py)
        autodiscover=False,
        datadir=datadir,
    )
    app.runner = runner
    source = app.topic(settings.input_topic, key_type=bytes, value_type=bytes)

    async def enqueue(origin: Origin, record: OutRecord) -> Awaitable[object]:
        return await app.producer.send(
            record.topic, record.key, record.value, None, seconds(origin.timestamp_ms),
            list(record.headers),
        )

    lone = _LoneProducer(settings)

    @app.agent(source, concurrency=1)
    async def assemble(stream: faust.StreamT[bytes]) -> None:
        collect_less()  # faust, its consumer and producer are up: freeze what they made
        in_flight: deque[tuple[list[EventT[bytes]], asyncio.Task[None]]] = deque()
        room = asyncio.Semaphore(MAX_IN_FLIGHT)
        arrived: asyncio.Queue[EventT[bytes] | None] = asyncio.Queue()  # None: reading ended
        acked = asyncio.Event()

        def ack_delivered(_: object = None) -> None:
            while in_flight and in_flight[0][1].done():
                if not _delivered(in_flight[0][1]):
                    return  # stopping: neither this batch nor any later one is acked
                events, _task = in_flight.popleft()
                for event in events:
                    event.ack()
                    room.release()
                acked.set()

        async def read() -> None:
            try:
                manual_acks = stream.noack()  # type: ignore[attr-defined]  # on Stream only
                async for event in manual_acks.events():
                    await room.acquire()
                    arrived.put_nowait(event)
            finally:
                arrived.put_nowait(None)

        commits = asyncio.create_task(_commit_delivered(app, acked, runner.stopping))
        reading = asyncio.create_task(read())
        try:
            while (events := await _next_batch(arrived)) is not None:
                inputs = [(value_of(e.message), Origin.from_record(e.message)) for e in events]
                outcomes = await runner.process_all(inputs)
                if runner.stopping.is_set():
                    # Unacked, so never committed, and unpublished, so redone once only:
                    # wait here until faust cancels the agent.
                    await asyncio.get_running_loop().create_future()
                task = runner.spawn(runner.deliver_all(
                    [(raw, origin, outcome) for (raw, origin), outcome in zip(
                        inputs, outcomes, strict=True)],
                    enqueue, lone.send,
                ))
                in_flight.append((events, task))
                task.add_done_callback(ack_delivered)
            await reading  # it ended: raise its error, if any
        finally:
            commits.cancel()
            reading.cancel()
            await lone.stop()

    return app


async def _next_batch(arrived: asyncio.Queue[EventT[bytes] | None]) -> list[EventT[bytes]] | None:
    """The events that arrived while the last batch was handled (at least one, waiting for
    it; at most ENGINE_BATCH), or None once reading has ended. No timer: a batch never
    waits for more events than are there."""
    event = await arrived.get()
    events: list[EventT[bytes]] = []
    while event is not None:
        events.append(event)
        if len(events) >= ENGINE_BATCH or arrived.empty():
            return events
        event = arrived.get_nowait()
    return None  # what was read but not handled stays unacked: redone by the next owner


async def _commit_delivered(app: faust.App, acked: asyncio.Event, stopping: asyncio.Event) -> None:
    """Commit what was acked each time more is: one commit at a time, at most every
    COMMIT_GAP_SECONDS, batching the acks that arrive meanwhile. faust commits only offsets
    below every unacked one, and acks are in input order, so no commit passes an undelivered
    event. Ends once stopping."""
    if not COMMIT_ON_DELIVERY:
        return
    while True:
        await acked.wait()
        if stopping.is_set():
            return  # the last commit is FaustWorker's, once deliveries have ended
        acked.clear()
        # Shielded: a commit cancelled midway loses its offsets from faust's books, and
        # every later commit of their partitions with them (a gap faust never closes).
        await asyncio.shield(app.consumer.commit())
        await asyncio.sleep(COMMIT_GAP_SECONDS)


class _LoneProducer:
    """Sends a record refused as too large once more, in a batch of its own: faust's
    producer batches records, and the broker refuses a batch over a topic's limit as if
    its every record were too large (`EventRunner.retry_forever`). Started on first use."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._security = kafka_security(settings)
        self._producer: AIOKafkaProducer | None = None
        self._starting = asyncio.Lock()

    async def send(self, origin: Origin, record: OutRecord) -> None:
        async with self._starting:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self._settings.bootstrap_servers, acks="all",
                    max_batch_size=1,  # no second record fits
                    max_request_size=self._settings.max_message_bytes,
                    request_timeout_ms=int(REQUEST_TIMEOUT_SECONDS * 1000),
                    compression_type=self._settings.producer_compression,
                    **self._security.client_args(),
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
    """faust's consumer, committing acked offsets before partitions are revoked: faust
    drops the acked, uncommitted offsets of revoked partitions first thing, and their next
    owner would redo those events."""

    logger = SERVICE_LOG

    async def on_partitions_revoked(self, revoked: set[TP]) -> None:
        if COMMIT_ON_DELIVERY:
            await self.commit(revoked)
        await super().on_partitions_revoked(revoked)

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    """Leaves the group when stopped, static member or not (context_assembler.kafka.membership)."""

    logger = SERVICE_LOG

    async def on_thread_stop(self) -> None:
        leave_on_stop(self._consumer)
        await super().on_thread_stop()

    async def _fetch_records(
        self, consumer: AIOKafkaConsumer, active_partitions: set[TP],
        timeout: float | None = None, max_records: int | None = None,
    ) -> RecordMap:
        """Fetched records; none, for good, once a batch could not be decoded: faust's
        fetcher crashed on it, and a restarted worker on the same batch. No retry: records
        of other partitions fetched in the same call are lost with the error, and faust,
        seeing later offsets, would take them for a gap and commit past them."""
        runner: EventRunner = self.app.runner  # type: ignore[attr-defined]  # on _App only
        if runner.undecodable is None:
            try:
                return await super()._fetch_records(consumer, active_partitions, timeout,
                                                    max_records)
            except UnsupportedCodecError as error:
                runner.cannot_decode(error)
        await asyncio.sleep(timeout or 0)  # faust asks again at once
        return {}


class _Tableless(TableManager):
    """faust's table manager without its start-up nap: it sleeps a second before anything
    else, presumably for tables to register, and a worker was ready 1.9-2.4 s after launch
    instead of 0.9 s, which a restarted replica's partitions waited out. This app declares
    no tables."""

    logger = SERVICE_LOG

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class _App(faust.App):
    logger = SERVICE_LOG
    runner: EventRunner  # its consumer thread reports undecodable input there

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


def _delivered(task: asyncio.Task[None]) -> bool:
    """True if the task delivered its event; False if stopping ended it first."""
    if task.cancelled():
        return False
    error = task.exception()
    if error is not None and not isinstance(error, Stopped):
        log.error("delivery failed; no later event is acked: %r", error, exc_info=error)
    return error is None


class FaustWorker(faust.Worker):
    """faust's worker, stopping within the grace period even while sends fail."""

    logger = SERVICE_LOG

    def __init__(self, app: faust.App, runner: EventRunner, loglevel: str) -> None:
        super().__init__(app, loglevel=loglevel, override_logging=False, quiet=True)
        self._runner = runner
        self._stopping: asyncio.Task[None] | None = None

    def install_signal_handlers(self) -> None:
        super().install_signal_handlers()
        for sig, stop in ((signal.SIGTERM, self._on_sigterm), (signal.SIGINT, self._on_sigint)):
            self.loop.add_signal_handler(sig, self._end_deliveries_then, stop)

    def _end_deliveries_then(self, stop: Callable[[], None]) -> None:
        if self._stopping is None:
            self._runner.stop()
            self._stopping = asyncio.ensure_future(self._stop_after_deliveries(stop))

    async def _stop_after_deliveries(self, stop: Callable[[], None]) -> None:
        await self._runner.drained()
        # Commit every delivered event. faust commits on stopping too, but a commit called
        # while another is in progress only waits for it, and that one predates the last
        # acks: so the first call may only wait, the second commits the rest.
        for _ in range(2):
            await self.app.consumer.commit()
        self.app.conf.stream_wait_empty = False  # what is left unacked stays so
        stop()
