"""Retries: delivery never gives up on an event while the worker runs.

Acking an event unanswered would lose it. Transient errors (broker down, leader elections,
timeouts) are retried with backoff. An error retrying cannot fix (a topic missing or not
authorized, a dead letter refused however small) is retried too, since only an operator can
fix it, but logged as an error each time and reported on /ready. A record the broker refuses
as too large is not retried as is: the topic's limit is learned (`record_sizes`) and the
event re-fitted. On SIGTERM the retries end; an event not yet delivered is never acked, so
the partition's next owner redoes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka.errors import (
    KafkaTimeoutError,
    UnknownTopicOrPartitionError,
)

from context_assembler.kafka.clients import acl_hint
from context_assembler.kafka.errors import kafka_error, too_large
from context_assembler.kafka.records import OutRecord
from context_assembler.kafka.tuning import FIRST_RETRY_SECONDS
from context_assembler.observability.metrics import Metrics

log = logging.getLogger(__name__)


class Stopped(Exception):
    """The worker is stopping: the event stays unacknowledged, for the next owner to redo."""


class Refused(Exception):
    """A record was refused as too large, and a smaller outcome can be made for its event."""


def persistent(error: BaseException) -> bool:
    """Retrying will not fix it: a missing or forbidden topic, a setting, a bug."""
    kafka = kafka_error(error)
    if kafka is None or isinstance(kafka, UnknownTopicOrPartitionError):
        return True  # topics are never auto-created here: a missing one stays missing
    return not (kafka.retriable or isinstance(kafka, KafkaTimeoutError))


class Retries:
    """One worker's retries: counted, backed off, ended by stopping; those failing
    persistently are `stuck`, which /ready reports."""

    def __init__(self, metrics: Metrics, backoff_max_seconds: float,
                 stopping: asyncio.Event) -> None:
        self.metrics = metrics
        self.backoff_max_seconds = backoff_max_seconds
        self.stopping = stopping
        self.stuck: dict[Attempts, str] = {}  # deliveries failing persistently, and why

    async def forever(
        self, what: str, attempt: Callable[[], Awaitable[object]],
        refusable: OutRecord | None = None, alone: Callable[[], Awaitable[object]] | None = None,
        learn: Callable[[OutRecord], bool] | None = None,
    ) -> None:
        """Run `attempt` until it succeeds: giving up would mean acking an unanswered event.

        Raises Stopped once the worker stops, and Refused if `refusable`, the record being
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
                        if learn is not None and learn(refusable):
                            raise Refused from error
                    await attempts.failed(error)
        finally:
            attempts.close()


class Attempts:
    """The failed attempts of one delivery: each is counted and logged, then waited out with
    exponential backoff. While the last failure is persistent, the worker is blocked."""

    def __init__(self, retries: Retries, what: str) -> None:
        self._retries = retries
        self._what = what
        self._delay = FIRST_RETRY_SECONDS

    async def failed(self, error: BaseException, what: str | None = None) -> None:
        """Record `error` (of `what`, if more precise than this delivery's name) and back
        off; raises Stopped if the worker stops meanwhile."""
        retries = self._retries
        what = what or self._what
        retries.metrics.retries.inc()
        if persistent(error):
            retries.stuck[self] = f"{what}: {error!r}{acl_hint(kafka_error(error))}"
            log.error("%s failed, retrying in %.1fs: %r%s", what, self._delay, error,
                      acl_hint(kafka_error(error)))
        else:
            retries.stuck.pop(self, None)
            log.warning("%s failed, retrying in %.1fs: %r", what, self._delay, error)
        try:
            await asyncio.wait_for(retries.stopping.wait(), self._delay)
        except TimeoutError:
            self._delay = min(self._delay * 2, retries.backoff_max_seconds)
            return
        raise Stopped

    def close(self) -> None:
        self._retries.stuck.pop(self, None)
