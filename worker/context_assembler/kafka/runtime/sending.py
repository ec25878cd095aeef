"""Sending an event's records until the broker took them (at_least_once).

Records go out in producer batches (`tuning.PRODUCER_BATCH_BYTES`), sent
PRODUCER_LINGER_MS after their first record at the latest: without a linger almost every
output went in a request of its own. A record that fails is retried (`retries`); one refused
as too large turns its event into what `records.fit` makes of it under the limit learned
(`record_sizes`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial

from context_assembler.kafka.records import Origin, Outcome, OutRecord
from context_assembler.kafka.runtime.engine_thread import EngineThread
from context_assembler.kafka.runtime.record_sizes import RecordSizes
from context_assembler.kafka.runtime.retries import Refused, Retries
from context_assembler.kafka.runtime.telemetry import Telemetry

log = logging.getLogger(__name__)
Send = Callable[[OutRecord], Awaitable[object]]
# Hands a record of the event at Origin to the producer; the awaitable it returns is done
# once the broker acknowledged the record (or failed with the reason it did not).
Enqueue = Callable[[Origin, OutRecord], Awaitable[Awaitable[object]]]
SendAlone = Callable[[Origin, OutRecord], Awaitable[object]]  # in a batch of its own


class Sender:
    """Delivers outcomes: every record sent until acknowledged, or the event re-fitted."""

    def __init__(self, telemetry: Telemetry, retries: Retries, sizes: RecordSizes,
                 engine: EngineThread) -> None:
        self._telemetry = telemetry
        self._metrics = telemetry.metrics
        self._retries = retries
        self._sizes = sizes
        self._engine = engine
        self._handing = asyncio.Lock()  # one batch's records reach the producer at a time

    async def deliver(
        self, raw: bytes, origin: Origin, outcome: Outcome, send: Send, alone: Send | None = None
    ) -> None:
        """Send each record of `outcome` until the broker acknowledges it.

        A record refused as too large (by `alone` too, if given: see `Retries.forever`) turns
        the event into what `fit` makes of it under the learned limit: an output_too_large
        dead letter (the event's other output may already be published: at least once allows
        it) or a shorter dead letter. Settles the event.
        """
        try:
            await self._deliver(raw, origin, outcome, send, alone)
        except BaseException as error:
            self._telemetry.settle(origin, error)
            raise
        self._telemetry.settle(origin)

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
        settle = self._telemetry.settle
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
                settle(origin, stopped)
            raise
        for index, record, acknowledged in sent:
            if acknowledged.cancelled():
                failed.setdefault(index, []).append((record, asyncio.CancelledError()))
            elif (error := acknowledged.exception()) is not None:
                failed.setdefault(index, []).append((record, error))
        retries = []
        for index, (raw, origin, outcome) in enumerate(events):
            if index not in failed:
                settle(origin)
                continue
            for record, cause in failed[index]:
                if cause is not None:
                    self._metrics.retries.inc()
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
                self._retries.forever(
                    f"produce to {r.topic}", partial(send, r), r if refusable else None,
                    partial(alone, r) if alone else None, self._sizes.learn,
                )
                for r in records
            )
            results = await asyncio.gather(*sends, return_exceptions=True)
            errors = [e for e in results if e is not None]
            if not errors:
                return
            if not all(isinstance(e, Refused) for e in errors):
                raise next(e for e in errors if not isinstance(e, Refused))
            refit = self._sizes.fit(outcome, raw, origin, self._engine.context)
            if refit.rejected is not None and outcome.rejected is None:
                self._metrics.dlq.labels(refit.rejected.reason).inc()
                log.warning(
                    "dead-lettered: %s", refit.rejected.message,
                    extra={"request_id": refit.rejected.request_id, "origin": str(origin),
                           "reason": refit.rejected.reason},
                )
            refusable = refit.records != records  # else: as small as it gets, keep trying
            outcome = refit


async def _send(enqueue: Enqueue, origin: Origin, record: OutRecord) -> None:
    await (await enqueue(origin, record))
