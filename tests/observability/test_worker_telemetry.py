"""The worker on a real broker, tracing to a fake OTLP/HTTP collector: the new metrics move
and each event's span reaches the collector in its input's trace."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from harness.kafka import Broker, running_broker
from harness.worker import Topics, WorkerProcess, events, keyed, produce, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with running_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture
def collector() -> Iterator[tuple[str, list[Span]]]:
    """An OTLP/HTTP endpoint on loopback keeping every span it is sent."""
    spans: list[Span] = []

    class Receive(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    spans.extend(scope.spans)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", spans
    finally:
        server.shutdown()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_metrics_and_spans_of_a_running_worker(
    broker: Broker, tmp_path: Path, collector: tuple[str, list[Span]], guarantee: str
) -> None:
    endpoint, spans = collector
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(12)
    worker = WorkerProcess(
        broker, topics, tmp_path / "worker.log", guarantee=guarantee,
        extra_env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"},
    ).start()
    try:
        worker.wait_ready()
        assert worker.metric("context_assembler_ready") == 1
        await produce(broker, topics.input, keyed(lines, [("traceparent", TRACEPARENT)]))
        committed = guarantee == "exactly_once"
        await read_topic(broker, topics.prompts, until=12, committed_only=committed, settle=1)
        assert worker.metric("context_assembler_end_to_end_latency_seconds_count") == 12
        assert worker.metric("context_assembler_in_flight_events") == 0
        page = worker.get("/metrics")[1].decode()
        assert f'context_assembler_consumer_lag{{partition="0",topic="{topics.input}"}}' in page
        assert worker.metric("context_assembler_consumer_lag") == 0
    finally:
        assert worker.stop() == 0
    events_spans = [s for s in spans if s.kind == Span.SpanKind.SPAN_KIND_CONSUMER]
    assert len(events_spans) == 12
    assert {s.trace_id.hex() for s in events_spans} == {TRACE_ID}
    assert {s.name for s in spans} == {f"process {topics.input}", "assemble", "publish"}
