"""Shared by both delivery paths: run the engine off the event loop, count, log, deliver, stop.

The engine is CPU work; running it in one worker thread keeps the event loop free for
heartbeats, fetches and /health while an event of 1,000 chunks is assembled. One thread
keeps events in order, and the engine's caches are thread-safe.

Delivery never gives up on an event while the worker runs: acking it unanswered would lose
it. Transient errors (broker down, leader elections, timeouts) are retried with backoff. An
error retrying cannot fix (a topic missing or not authorized, a dead letter refused however
small) is retried too, since only an operator can fix it, but logged as an error each time
and reported on /ready. A record the broker refuses as too large is not retried as is: the
topic's limit is learned and the event re-fitted (`records.fit`). On SIGTERM the retries
end; an event not yet delivered is never acked, so the partition's next owner redoes it.

Each event is in flight from `process` until it is settled: acknowledged (its end-to-end
latency observed, its span ended) or given up to the next owner (its span ended as an error).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError, UnsupportedCodecError
from opentelemetry.trace import Span

from context_assembler.intake.framing import Resolved, schema_id_of
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.clients import acl_hint
from context_assembler.kafka.errors import kafka_error, too_large
from context_assembler.kafka.records import (
    Handler,
    HandlerContext,
    Origin,
    Outcome,
    OutRecord,
    fit,
    handle,
    record_size,
)
from context_assembler.kafka.schema_registry import OutputIds, RegistryUnavailable, SchemaRegistry
from context_assembler.kafka.tuning import FIRST_RETRY_SECONDS, PRODUCER_BATCH_BYTES
from context_assembler.kafka.undecodable import undecodable
from context_assembler.observability.metrics import Metrics
from context_assembler.observability.summary import AssemblySummary
from context_assembler.observability.tracing import Tracing
from context_assembler.settings import MIN_MESSAGE_BYTES, Settings

log = logging.getLogger(__name__)
Send = Callable[[OutRecord], Awaitable[object]]
# Hands a record of the event at Origin to the producer; the awaitable it returns is done
# once the broker acknowledged the record (or failed with the reason it did not).
Enqueue = Callable[[Origin, OutRecord], Awaitable[Awaitable[object]]]
SendAlone = Callable[[Origin, OutRecord], Awaitable[object]]  # in a batch of its own


class Stopped(Exception):
    """The worker is stopping: the event stays unacknowledged, for the next owner to redo."""


class _Refused(Exception):
    """A record was refused as too large, and a smaller outcome can be made for its event."""


def persistent(error: BaseException) -> bool:
    """Retrying will not fix it: a missing or forbidden topic, a setting, a bug."""
    kafka = kafka_error(error)
    if kafka is None or isinstance(kafka, UnknownTopicOrPartitionError):
        return True  # topics are never auto-created here: a missing one stays missing
    return not (kafka.retriable or isinstance(kafka, KafkaTimeoutError))


class Attempts:
    """The failed attempts of one delivery: each is counted and logged, then waited out with
    exponential backoff. While the last failure is persistent, the runner is blocked."""

    def __init__(self, runner: EventRunner, what: str) -> None:
        self._runner = runner
        self._what = what
        self._delay = FIRST_RETRY_SECONDS

    async def failed(self, error: BaseException, what: str | None = None) -> None:
        """Record `error` (of `what`, if more precise than this delivery's name) and back
        off; raises Stopped if the worker stops meanwhile."""
        runner = self._runner
        what = what or self._what
        runner.metrics.retries.inc()
        if persistent(error):
            runner.stuck[self] = f"{what}: {error!r}{acl_hint(kafka_error(error))}"
            log.error("%s failed, retrying in %.1fs: %r%s", what, self._delay, error,
                      acl_hint(kafka_error(error)))
        else:
            runner.stuck.pop(self, None)
            log.warning("%s failed, retrying in %.1fs: %r", what, self._delay, error)
        try:
            await asyncio.wait_for(runner.stopping.wait(), self._delay)
        except TimeoutError:
            self._delay = min(self._delay * 2, runner.settings.retry_backoff_max_seconds)
            return
        raise Stopped

    def close(self) -> None:
        self._runner.stuck.pop(self, None)


class EventRunner:
    """Runs one worker's events: handled in the engine thread, counted, logged, delivered."""

    def __init__(
        self,
        settings: Settings,
        registry: PolicyRegistry,
        metrics: Metrics,
        handler: Handler = handle,  # the benchmark swaps in a passthrough
        tracing: Tracing | None = None,  # default: from OTEL_EXPORTER_OTLP_ENDPOINT
        schemas: SchemaRegistry | None = None,  # framed events' schemas, if a registry is set
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.tracing = tracing or Tracing.from_environment()
        self._spans: dict[tuple[str, int, int], tuple[Span, Span]] = {}  # event's, publish
        self._positions: dict[tuple[str, int], int] = {}  # next offset to process
        self._handler = handler
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._context = HandlerContext.for_worker(settings, registry)
        self._schemas = schemas
        if schemas is not None:
            self._context = replace(self._context, schemas={})
        self._limits: dict[str, int] = {}  # learned from the broker's refusals, per topic
        self.stuck: dict[Attempts, str] = {}  # deliveries failing persistently, and why
        self.undecodable: str | None = None  # why input is no longer read (`cannot_decode`)
        self.stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handing = asyncio.Lock()  # one batch's records reach the producer at a time
        self.summary = AssemblySummary()

    @property
    def blocked(self) -> str | None:
        """Why delivery is stuck until an operator acts, or None; /ready is false meanwhile."""
        return self.undecodable or next(iter(self.stuck.values()), None)

    def cannot_decode(self, error: UnsupportedCodecError) -> None:
        """A fetched batch cannot be decoded (a codec library missing): the consumer reads no
        more, so nothing past the batch is handled or committed, and /ready says why until
        an operator installs the codec and restarts the worker. Logged once. Called from
        faust's consumer thread too, so it only sets an attribute and logs."""
        if self.undecodable is None:
            self.undecodable = undecodable(error, self.settings.input_topic)
            log.error("%s; not reading any further until restarted, nothing is committed "
                      "past these records", self.undecodable)

    def frame_outputs(self, ids: OutputIds) -> None:
        """Frame prompts and audits with these registered ids from now on."""
        self._context = replace(self._context, prompt_schema_id=ids.prompt,
                                audit_schema_id=ids.audit)

    async def _schemas_of(self, events: Sequence[tuple[bytes, Origin]]) -> dict[int, Resolved]:
        """The schemas the framed events name, from the registry: while it does not answer,
        retried with backoff (reported on /ready), holding these events and so, once
        max-in-flight are held, reading; raises Stopped if the worker stops meanwhile."""
        assert self._schemas is not None
        ids = {schema_id for raw, _ in events if (schema_id := schema_id_of(raw)) is not None}
        if not ids:
            return {}
        attempts = Attempts(self, "read schemas from the schema registry")
        try:
            while True:
                try:
                    return await self._schemas.resolve(ids)
                except RegistryUnavailable as error:
                    await attempts.failed(error)
        finally:
            attempts.close()

    def _handle(
        self, events: Sequence[tuple[bytes, Origin]], context: HandlerContext
    ) -> list[tuple[Outcome, float]]:
        handled = []
        for raw, origin in events:
            started = time.perf_counter()
            outcome = self._handler(raw, origin, context)
            handled.append((outcome, time.perf_counter() - started))
        return handled

    async def process(self, raw: bytes, origin: Origin) -> Outcome:
        """The event's outcome; the event is in flight until `settle`d."""
        return (await self.process_all([(raw, origin)]))[0]

    async def process_all(self, events: Sequence[tuple[bytes, Origin]]) -> list[Outcome]:
        """The events' outcomes, in order, from one trip to the engine thread: a trip per
        event cost more than the Kafka path it feeds. Each event is in flight until `settle`d.
        With a schema registry, the schemas the framed events name are fetched first."""
        loop = asyncio.get_running_loop()
        received_ns = time.time_ns() if self.tracing.enabled else 0
        context = self._context
        if self._schemas is not None:
            context = replace(context, schemas=await self._schemas_of(events))
        handled = await loop.run_in_executor(self._executor, self._handle, events, context)
        return [
            self._processed(raw, origin, outcome, seconds, received_ns)
            for (raw, origin), (outcome, seconds) in zip(events, handled, strict=True)
        ]

    def _processed(
        self, raw: bytes, origin: Origin, outcome: Outcome, seconds: float, received_ns: int
    ) -> Outcome:
        if self._limits:
            outcome = fit(outcome, raw, origin, self._context, self._limits)
        self.metrics.observe(outcome.assembly, outcome.rejected, seconds)
        self.metrics.in_flight.inc()
        self._positions[origin.topic, origin.partition] = origin.offset + 1
        if self.tracing.enabled:
            self._trace(origin, outcome, received_ns)
        if outcome.rejected is not None:
            self.summary.rejected(outcome.rejected.reason)
            log.warning(
                "rejected input: %s", outcome.rejected.message,
                extra={"request_id": outcome.rejected.request_id, "origin": str(origin),
                       "reason": outcome.rejected.reason},
            )
        elif outcome.assembly is not None:
            audit = outcome.assembly.audit
            self.summary.assembled(audit.tokens.prompt)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "assembled", extra={"request_id": audit.request_id, "origin": str(origin),
                                        "kept": len(audit.kept), "dropped": len(audit.dropped),
                                        "tokens": audit.tokens.prompt},
                )
        return outcome

    def _trace(self, origin: Origin, outcome: Outcome, received_ns: int) -> None:
        """Open the event's span (received to settled), with its assemble step done and its
        publish step begun."""
        tracing = self.tracing
        span = tracing.begin(
            origin.topic, origin.partition, origin.offset, origin.key, origin.headers,
            self.settings.group_id, received_ns,
        )
        assembled_ns = time.time_ns()
        tracing.child(span, "assemble", received_ns).end(assembled_ns)
        tracing.assembled(span, outcome.assembly, outcome.rejected)
        key = (origin.topic, origin.partition, origin.offset)
        self._spans[key] = (span, tracing.child(span, "publish", assembled_ns))

    def settle(self, origin: Origin, error: BaseException | None = None) -> None:
        """The event's outputs were acknowledged (`error` None), or will not be by this
        worker: no longer in flight."""
        self.metrics.in_flight.dec()
        if error is None:
            self.metrics.acknowledged(origin.timestamp_ms, time.time() * 1000)
        spans = self._spans.pop((origin.topic, origin.partition, origin.offset), None)
        if spans is not None:
            span, publish = spans
            if error is not None:
                self.tracing.failed(publish, error)
                self.tracing.failed(span, error)
            publish.end()
            span.end()

    @contextmanager
    def settling(self) -> Iterator[list[Origin]]:
        """Settles the events appended to the list, together: acknowledged if the block ends
        normally (a transaction committed), not delivered if it raises."""
        origins: list[Origin] = []
        try:
            yield origins
        except BaseException as error:
            for origin in origins:
                self.settle(origin, error)
            raise
        for origin in origins:
            self.settle(origin)

    def watch_lag(self, end_offset: Callable[[TopicPartition], int | None]) -> None:
        """Report consumer lag on scrape: `end_offset` (a consumer's highwater, or its last
        stable offset under read_committed) minus the next offset to process, for each
        partition processed here. Revoked partitions (the consumer raises or answers None)
        are skipped, as are partitions held but not processed yet."""

        def lag() -> Iterator[tuple[str, int, int]]:
            for (topic, partition), position in list(self._positions.items()):
                try:
                    end = end_offset(TopicPartition(topic, partition))
                except Exception:  # not assigned (any more), or the consumer is stopping
                    continue
                if end is not None:
                    yield topic, partition, max(end - position, 0)

        self.metrics.lag.source = lag

    @property
    def batch_bytes(self) -> int:
        """The producers' batch size: no batch may be larger than a topic takes."""
        return min(PRODUCER_BATCH_BYTES, self.settings.max_message_bytes, *self._limits.values())

    def learn(self, record: OutRecord) -> bool:
        """The broker refused `record` as too large (its topic's max.message.bytes is below
        max_message_bytes): keep later records for that topic smaller. False if no smaller
        record can stand in for it. A dead letter can be cut further, so its topic's limit
        is halved, to fit in a few rounds; an output cannot, so only its size is excluded."""
        size = record_size(record)
        if record.topic == self.settings.dlq_topic:
            limit = max(size // 2, MIN_MESSAGE_BYTES)
        else:
            limit = size - 1
        if limit >= size:
            return False
        log.warning(
            "%s refused a record of %d bytes: its max.message.bytes is below "
            "ASSEMBLER_MAX_MESSAGE_BYTES=%d; sending it at most %d bytes from now on",
            record.topic, size, self.settings.max_message_bytes, limit,
        )
        self._limits[record.topic] = min(limit, self._limits.get(record.topic, limit))
        return True

    async def retry_forever(
        self, what: str, attempt: Callable[[], Awaitable[object]],
        refusable: OutRecord | None = None, alone: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        """Run `attempt` until it succeeds: giving up would mean acking an unanswered event.

        Raises Stopped once the worker stops, and _Refused if `refusable`, the record being
        sent, is refused as too large and `learn` says a smaller one can stand in for it.
        `alone` sends the record in a batch of its own: the broker refuses a batch over the
        topic's limit as if its every record were too large, so a refused record is tried
        alone, from then on, before anything is learned from its refusal.
        """
        attempts = Attempts(self, what)
        try:
            while True:
                try:
                    await attempt()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    if refusable is not None and too_large(error):
                        if alone is not None:
                            attempt, alone = alone, None
                            continue
                        if self.learn(refusable):
                            raise _Refused from error
                    await attempts.failed(error)
        finally:
            attempts.close()

    async def deliver(
        self, raw: bytes, origin: Origin, outcome: Outcome, send: Send, alone: Send | None = None
    ) -> None:
        """Send each record of `outcome` until the broker acknowledges it.

        A record refused as too large (by `alone` too, if given: see `retry_forever`) turns
        the event into what `fit` makes of it under the learned limit: an output_too_large
        dead letter (the event's other output may already be published: at least once allows
        it) or a shorter dead letter. Settles the event.
        """
        try:
            await self._deliver(raw, origin, outcome, send, alone)
        except BaseException as error:
            self.settle(origin, error)
            raise
        self.settle(origin)

    async def deliver_all(
        self, events: Sequence[tuple[bytes, Origin, Outcome]], enqueue: Enqueue,
        alone: SendAlone | None = None,
    ) -> None:
        """`deliver` the events together: `enqueue(event's origin, record)` hands a record
        to the producer and returns its acknowledgement, so every record of the batch shares
        the producer's batches with no task per record, in input order after the batches
        before it. The records that fail are handed to `deliver`, event by event (so a
        retried record may come out after later ones). Raises the first error once every
        delivery has ended."""
        sent: list[tuple[int, OutRecord, asyncio.Future[object]]] = []  # event's index
        failed: dict[int, list[tuple[OutRecord, BaseException | None]]] = {}  # None: not tried
        try:
            # Batches delivered concurrently hand their records over one after the other:
            # a send waiting for a topic's metadata let a later batch's records pass.
            async with self._handing:
                for index, (_, origin, outcome) in enumerate(events):
                    for record in outcome.records:
                        if failed:  # the rest go event by event, concurrently, as `deliver`
                            failed.setdefault(index, []).append((record, None))
                            continue
                        try:
                            acknowledged: asyncio.Future[object] = asyncio.ensure_future(
                                await enqueue(origin, record))
                        except Exception as refused:  # before sending: too large, no metadata
                            failed[index] = [(record, refused)]
                            continue
                        sent.append((index, record, acknowledged))
            if sent:
                await asyncio.wait([acknowledged for _, _, acknowledged in sent])
        except BaseException as stopped:  # cancelled: stopping
            for _, origin, _outcome in events:
                self.settle(origin, stopped)
            raise
        for index, record, acknowledged in sent:
            if acknowledged.cancelled():
                failed.setdefault(index, []).append((record, asyncio.CancelledError()))
            elif (error := acknowledged.exception()) is not None:
                failed.setdefault(index, []).append((record, error))
        retries = []
        for index, (raw, origin, outcome) in enumerate(events):
            if index not in failed:
                self.settle(origin)
                continue
            for record, cause in failed[index]:
                if cause is not None:
                    self.metrics.retries.inc()
                    log.warning("produce to %s failed, retrying: %r", record.topic, cause)
            left = tuple(record for record in outcome.records
                         if any(record is r for r, _ in failed[index]))
            retries.append(self.deliver(
                raw, origin, Outcome(left, outcome.assembly, outcome.rejected),
                partial(_send, enqueue, origin), partial(alone, origin) if alone else None))
        results = await asyncio.gather(*retries, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _deliver(
        self, raw: bytes, origin: Origin, outcome: Outcome, send: Send, alone: Send | None
    ) -> None:
        refusable = True
        while True:
            records = outcome.records
            sends = (
                self.retry_forever(
                    f"produce to {r.topic}", partial(send, r), r if refusable else None,
                    partial(alone, r) if alone else None,
                )
                for r in records
            )
            results = await asyncio.gather(*sends, return_exceptions=True)
            errors = [e for e in results if e is not None]
            if not errors:
                return
            if not all(isinstance(e, _Refused) for e in errors):
                raise next(e for e in errors if not isinstance(e, _Refused))
            refit = fit(outcome, raw, origin, self._context, self._limits)
            if refit.rejected is not None and outcome.rejected is None:
                self.metrics.dlq.labels(refit.rejected.reason).inc()
                log.warning(
                    "dead-lettered: %s", refit.rejected.message,
                    extra={"request_id": refit.rejected.request_id, "origin": str(origin),
                           "reason": refit.rejected.reason},
                )
            refusable = refit.records != records  # else: as small as it gets, keep trying
            outcome = refit

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` as a task that stopping may cancel (see `stop`)."""
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stop(self) -> None:
        """Stop retrying; cancel spawned work still running after half the grace period;
        exit the process if it is still running after all of it.

        What is cancelled was never acknowledged, so it was never committed: the partition's
        next owner redoes it. The hard exit skips leaving the group cleanly: the partitions
        wait out the session timeout, which is still safe.
        """
        if self.stopping.is_set():
            return
        self.stopping.set()
        grace = self.settings.shutdown_grace_seconds
        log.info("stopping: in-flight events have %.0fs to be delivered", grace / 2)
        loop = asyncio.get_running_loop()
        loop.call_later(grace / 2, self._cancel_in_flight)
        loop.call_later(grace, _exit_now, grace)

    def _cancel_in_flight(self) -> None:
        if self._tasks:
            log.warning("%d deliveries still in flight are cancelled; the next owner of their "
                        "partitions redoes those events", len(self._tasks))
        for task in self._tasks:
            task.cancel()

    async def drained(self) -> None:
        """Return once every spawned task has ended: delivered, stopped or cancelled."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def close(self) -> None:
        self.summary.flush()
        self._executor.shutdown(wait=True)
        self.tracing.shutdown()


async def _send(enqueue: Enqueue, origin: Origin, record: OutRecord) -> None:
    await (await enqueue(origin, record))


def _exit_now(grace: float) -> None:
    log.error("still stopping after ASSEMBLER_SHUTDOWN_GRACE_SECONDS=%.0f; exiting now", grace)
    logging.shutdown()
    os._exit(1)
