"""What the worker tells about its events: metrics, logs, traces, the summary, lag.

Each event is in flight from `processed` until it is settled: acknowledged (its end-to-end
latency observed, its span ended) or given up to the next owner (its span ended as an error).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from aiokafka import TopicPartition
from opentelemetry.trace import Span

from context_assembler.kafka.records import Origin, Outcome
from context_assembler.observability.metrics import Metrics
from context_assembler.observability.summary import AssemblySummary
from context_assembler.observability.tracing import Tracing

log = logging.getLogger(__name__)


class Telemetry:
    """One worker's counts, logs, spans and positions (for the lag)."""

    def __init__(self, metrics: Metrics, group_id: str, tracing: Tracing | None) -> None:
        self.metrics = metrics
        self.tracing = tracing or Tracing.from_environment()
        self.summary = AssemblySummary()
        self._group_id = group_id
        self._spans: dict[tuple[str, int, int], tuple[Span, Span]] = {}  # event's, publish
        self._positions: dict[tuple[str, int], int] = {}  # next offset to process

    def received_ns(self) -> int:
        """When events were received, for their spans (0 without tracing)."""
        return time.time_ns() if self.tracing.enabled else 0

    def processed(self, origin: Origin, outcome: Outcome, seconds: float,
                  received_ns: int) -> None:
        """The engine made `outcome` of the event in `seconds`: it is in flight until
        `settle`d."""
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

    def _trace(self, origin: Origin, outcome: Outcome, received_ns: int) -> None:
        """Open the event's span (received to settled), with its assemble step done and its
        publish step begun."""
        tracing = self.tracing
        span = tracing.begin(
            origin.topic, origin.partition, origin.offset, origin.key, origin.headers,
            self._group_id, received_ns,
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

    def close(self) -> None:
        self.summary.flush()
        self.tracing.shutdown()
