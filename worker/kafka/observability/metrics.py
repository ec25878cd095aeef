"""Prometheus metrics (one registry per worker, names follow _total/_seconds conventions).

Fed with the engine's and the intake's own values, so it knows nothing of Kafka records.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from schemas.models import DropReason
from worker.engine import Assembly
from worker.intake.codec import RejectedInput


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
        self.latency = Histogram(
            f"{prefix}_assembly_duration_seconds", "Engine time per event.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.retries = Counter(
            f"{prefix}_delivery_retries_total", "Produce attempts that failed and were retried.",
            registry=self.registry,
        )
        self.assigned = Gauge(
            f"{prefix}_assigned_partitions", "Input partitions assigned to this worker.",
            registry=self.registry,
        )
        for outcome in ("assembled", "rejected"):
            self.events.labels(outcome)
        for reason in DropReason:
            self.chunks.labels(reason.value)
        self.chunks.labels("kept")

    def observe(
        self, assembly: Assembly | None, rejected: RejectedInput | None, seconds: float
    ) -> None:
        """One event handled in `seconds`: assembled, or rejected (and dead-lettered)."""
        self.latency.observe(seconds)
        if rejected is not None:
            self.events.labels("rejected").inc()
            self.dlq.labels(rejected.reason).inc()
            return
        self.events.labels("assembled").inc()
        if assembly is None:  # the benchmark's passthrough
            return
        audit = assembly.audit
        self.chunks.labels("kept").inc(len(audit.kept))
        for dropped in audit.dropped:
            self.chunks.labels(dropped.reason.value).inc()
        self.tokens.labels("context").inc(audit.tokens.context)
        self.tokens.labels("prompt").inc(audit.tokens.prompt)
        if audit.abstained:
            self.abstained.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
