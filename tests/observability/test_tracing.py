"""One span per event through the shared runner, exported in memory; and no cost when off."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import Origin, OutRecord
from context_assembler.kafka.runtime.retries import Stopped
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.observability.metrics import Metrics
from context_assembler.observability.tracing import Tracing
from context_assembler.settings import Settings
from tests.kafka.test_records import GOOD, origin

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()


def make(tracing: Tracing) -> EventRunner:
    settings = Settings.model_validate({"prompts_topic": "prompts", "audit_topic": "audit",
                                        "dlq_topic": "dlq", "group_id": "assemblers",
                                        "retry_backoff_max_seconds": 0.05})
    return EventRunner(settings, PolicyRegistry(Policy()), Metrics(), tracing=tracing)


async def run_one(raw: bytes, source: Origin) -> tuple[list[ReadableSpan], list[OutRecord]]:
    exporter = InMemorySpanExporter()
    runner = make(Tracing.with_processor(SimpleSpanProcessor(exporter)))
    sent: list[OutRecord] = []

    async def send(record: OutRecord) -> None:
        sent.append(record)

    outcome = await runner.process(raw, source)
    await runner.deliver(raw, source, outcome, send)
    runner.close()
    return list(exporter.get_finished_spans()), sent


def event_span(spans: list[ReadableSpan]) -> ReadableSpan:
    (span,) = [s for s in spans if s.kind is SpanKind.CONSUMER]
    return span


async def test_an_assembled_event_has_one_span_continuing_the_inputs_trace() -> None:
    spans, sent = await run_one(GOOD, origin((("traceparent", TRACEPARENT),)))
    span = event_span(spans)
    assert span.name == "process retrieval.results"
    assert span.context is not None and format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and span.parent.span_id == 0x00F067AA0BA902B7
    attributes = dict(span.attributes or {})
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.destination.name"] == "retrieval.results"
    assert attributes["messaging.destination.partition.id"] == "2"
    assert attributes["messaging.kafka.offset"] == 41
    assert attributes["messaging.kafka.message.key"] == "q30-staff"
    assert attributes["messaging.consumer.group.name"] == "assemblers"
    assert attributes["context_assembler.outcome"] == "assembled"
    assert isinstance(attributes["context_assembler.kept"], int)
    assert attributes["context_assembler.kept"] > 0
    assert isinstance(attributes["context_assembler.tokens.prompt"], int)
    assert attributes["context_assembler.tokens.prompt"] > 0
    assert str(attributes["context_assembler.policy.hash"]).startswith("sha256:")
    assert "context_assembler.dropped" in attributes
    assert span.status.status_code is StatusCode.UNSET
    # assemble and publish are its children, in the same trace
    steps = {s.name: s for s in spans if s is not span}
    assert set(steps) == {"assemble", "publish"}
    for step in steps.values():
        assert step.parent is not None and span.context is not None
        assert step.parent.span_id == span.context.span_id
    # outputs still carry the input's traceparent verbatim: tracing changes no byte
    assert all(dict(r.headers)["traceparent"] == TRACEPARENT for r in sent)


async def test_outputs_are_the_same_bytes_with_tracing_on_or_off() -> None:
    source = origin((("traceparent", TRACEPARENT),))
    _, traced = await run_one(GOOD, source)
    untraced: list[OutRecord] = []

    async def send(record: OutRecord) -> None:
        untraced.append(record)

    runner = make(Tracing())
    await runner.deliver(GOOD, source, await runner.process(GOOD, source), send)
    runner.close()
    assert traced == untraced


async def test_a_rejected_event_has_an_error_span_with_its_reason() -> None:
    spans, sent = await run_one(b"{bad", origin())
    span = event_span(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None and span.status.description.startswith("json")
    attributes = dict(span.attributes or {})
    assert attributes["context_assembler.outcome"] == "rejected"
    assert attributes["context_assembler.reject.reason"] == "json"
    assert [r.topic for r in sent] == ["dlq"]


async def test_without_a_valid_traceparent_the_span_starts_a_trace_and_a_binary_key_is_left_out(
) -> None:
    source = Origin("retrieval.results", 0, 7, b"\xff\xfe", (("traceparent", b"junk"),), None)
    span = event_span((await run_one(GOOD, source))[0])
    assert span.parent is None
    assert "messaging.kafka.message.key" not in dict(span.attributes or {})


async def test_an_event_not_delivered_ends_its_span_as_an_error() -> None:
    exporter = InMemorySpanExporter()
    runner = make(Tracing.with_processor(SimpleSpanProcessor(exporter)))
    outcome = await runner.process(GOOD, origin())

    async def fail(record: OutRecord) -> None:
        runner.stopping.set()
        raise ConnectionError("broker down")

    with pytest.raises(Stopped):
        await runner.deliver(GOOD, origin(), outcome, fail)
    runner.close()
    span = event_span(list(exporter.get_finished_spans()))
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None and "not delivered" in span.status.description


def test_tracing_is_off_unless_the_otlp_endpoint_is_set() -> None:
    assert not Tracing.from_environment(environ={}).enabled
    tracing = Tracing.from_environment(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert tracing.enabled
    tracing.shutdown()


async def test_with_tracing_off_no_span_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a span was made with tracing off")

    monkeypatch.setattr(Tracing, "begin", refuse)
    monkeypatch.setattr(Tracing, "child", refuse)
    runner = make(Tracing())
    outcome = await runner.process(GOOD, origin())
    await runner.deliver(GOOD, origin(), outcome, lambda record: asyncio.sleep(0))
    runner.close()


async def test_in_flight_and_end_to_end_latency_follow_acknowledgements() -> None:
    runner = make(Tracing())
    registry = runner.metrics.registry
    sent_at = int(time.time() * 1000) - 1500  # the input was produced 1.5 s ago
    source = Origin("retrieval.results", 3, 9, b"k", (), sent_at)
    outcome = await runner.process(GOOD, source)
    assert registry.get_sample_value("context_assembler_in_flight_events") == 1
    await runner.deliver(GOOD, source, outcome, lambda record: asyncio.sleep(0))
    assert registry.get_sample_value("context_assembler_in_flight_events") == 0
    name = "context_assembler_end_to_end_latency_seconds"
    assert registry.get_sample_value(f"{name}_count") == 1
    assert registry.get_sample_value(f"{name}_bucket", {"le": "1.0"}) == 0
    assert registry.get_sample_value(f"{name}_bucket", {"le": "2.5"}) == 1
    # consumer lag: the partition's end offset minus the next offset to process (10)
    runner.watch_lag(lambda tp: {("retrieval.results", 3): 25}[tp.topic, tp.partition])
    labels = {"topic": "retrieval.results", "partition": "3"}
    assert registry.get_sample_value("context_assembler_consumer_lag", labels) == 15
    runner.close()


async def test_a_batch_settles_together_acknowledged_or_not() -> None:
    runner = make(Tracing())
    registry = runner.metrics.registry
    first, second = origin(), Origin("retrieval.results", 2, 42, None, (), None)
    with runner.settling() as origins:
        for source in (first, second):
            await runner.process(GOOD, source)
            origins.append(source)
        assert registry.get_sample_value("context_assembler_in_flight_events") == 2
    assert registry.get_sample_value("context_assembler_in_flight_events") == 0
    assert registry.get_sample_value("context_assembler_end_to_end_latency_seconds_count") == 1
    with pytest.raises(ConnectionError), runner.settling() as origins:  # an aborted transaction
        await runner.process(GOOD, first)
        origins.append(first)
        raise ConnectionError("aborted")
    assert registry.get_sample_value("context_assembler_in_flight_events") == 0
    assert registry.get_sample_value("context_assembler_end_to_end_latency_seconds_count") == 1
    runner.close()


def test_lag_skips_partitions_the_consumer_no_longer_holds() -> None:
    metrics = Metrics()
    assert metrics.registry.get_sample_value(
        "context_assembler_consumer_lag", {"topic": "t", "partition": "0"}) is None
    metrics.lag.source = lambda: [("t", 0, 4)]
    assert metrics.registry.get_sample_value(
        "context_assembler_consumer_lag", {"topic": "t", "partition": "0"}) == 4
