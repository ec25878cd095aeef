"""Prometheus metrics (one registry per worker, names follow _total/_seconds conventions).

Fed with the engine's and the intake's own values, so it knows nothing of Kafka records;
what only a consumer knows (lag, readiness) is sampled on scrape from callbacks the worker
sets (`lag.source`, `ready.set_function`). deploy/grafana and deploy/prometheus use these
names; tests/deploy/test_observability_assets.py checks them against this registry.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from context_assembler.contract.models import DropReason
from context_assembler.engine import Assembly
from context_assembler.intake.codec import RejectedInput


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        prefix = "context_assembler"
        self.events = Counter(
            f"{prefix}_events_total", "Input events by outcome.", ["outcome"],
            registry=self.registry,
        )
        self.chunks = Counter(
            f"{prefix}_chunks_total", "Input chunks by decision (kept or a drop reason).",
            ["decision"], registry=self.registry,
        )
        self.tokens = Counter(
            f"{prefix}_tokens_total", "Tokens assembled, by part (context or prompt).",
            ["part"], registry=self.registry,
        )
        self.abstained = Counter(
            f"{prefix}_abstained_total", "Requests left with nothing usable.",
            registry=self.registry,
        )
        self.dlq = Counter(
            f"{prefix}_dlq_records_total", "Inputs sent to the dead-letter topic, by reason.",
            ["reason"], registry=self.registry,
        )
        self.refused = Counter(
            f"{prefix}_http_rejections_total",
            "HTTP requests answered with an error (serve), by reason; nothing is dead-lettered.",
            ["reason"], registry=self.registry,
        )
        self.latency = Histogram(
            f"{prefix}_assembly_duration_seconds", "Engine time per event.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.retries = Counter(
            f"{prefix}_delivery_retries_total", "Produce attempts that failed and were retried.",
            registry=self.registry,
        )
        self.transactions = Counter(
            f"{prefix}_transactions_total",
            "Transactions committed (exactly_once): one per input partition per commit round.",
            registry=self.registry,
        )
        self.assigned = Gauge(
            f"{prefix}_assigned_partitions", "Input partitions assigned to this worker.",
            registry=self.registry,
        )
        self.ready = Gauge(
            f"{prefix}_ready", "1 while /ready answers 200, else 0.",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            f"{prefix}_in_flight_events",
            "Events taken from the input whose outputs are not yet acknowledged.",
            registry=self.registry,
        )
        self.end_to_end = Histogram(
            f"{prefix}_end_to_end_latency_seconds",
            "From the input record's timestamp to its outputs' acknowledgement by the broker.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=self.registry,
        )
        self.lag = LagCollector(f"{prefix}_consumer_lag")
        self.registry.register(self.lag)
        # Labelled children looked up once: `labels()` per event and per dropped chunk was
        # a tenth of the event loop's time under load.
        self._assembled = self.events.labels("assembled")
        self._rejected = self.events.labels("rejected")
        self._kept = self.chunks.labels("kept")
        self._dropped = {reason: self.chunks.labels(reason.value) for reason in DropReason}
        self._context_tokens = self.tokens.labels("context")
        self._prompt_tokens = self.tokens.labels("prompt")

    def observe(
        self, assembly: Assembly | None, rejected: RejectedInput | None, seconds: float,
        *, dead_lettered: bool = True,
    ) -> None:
        """One event handled in `seconds`: assembled, or rejected: dead-lettered by the worker,
        answered with an error by the HTTP endpoint (`dead_lettered=False`)."""
        self.latency.observe(seconds)
        if rejected is not None:
            self._rejected.inc()
            counter = self.dlq if dead_lettered else self.refused
            counter.labels(rejected.reason).inc()
            return
        self._assembled.inc()
        if assembly is None:  # the benchmark's passthrough
            return
        audit = assembly.audit
        if audit.kept:
            self._kept.inc(len(audit.kept))
        if audit.dropped:
            for reason, count in collections.Counter(d.reason for d in audit.dropped).items():
                self._dropped[reason].inc(count)
        self._context_tokens.inc(audit.tokens.context)
        self._prompt_tokens.inc(audit.tokens.prompt)
        if audit.abstained:
            self.abstained.inc()

    def acknowledged(self, timestamp_ms: int | None, now_ms: float) -> None:
        """An event's outputs were acknowledged at `now_ms` (wall clock, never in outputs);
        a record without a timestamp, or one from the future, is not observed."""
        if timestamp_ms is not None and now_ms >= timestamp_ms:
            self.end_to_end.observe((now_ms - timestamp_ms) / 1000)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


LagSource = Callable[[], Iterable[tuple[str, int, int]]]


class LagCollector(Collector):
    """Consumer lag per input partition, sampled on scrape: `source` yields (topic,
    partition, lag) for the partitions the worker holds. Without a source: no samples."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.source: LagSource = tuple

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        for topic, partition, lag in self.source():
            family.add_metric([topic, str(partition)], lag)
        yield family

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            self.name, "Records in the partition past the worker's position (highwater - next "
            "offset to process).", labels=["topic", "partition"],
        )
