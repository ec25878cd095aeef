"""OpenTelemetry spans, one per input event or HTTP request, continuing its W3C `traceparent`.

Off unless OTEL_EXPORTER_OTLP_ENDPOINT is set: then no SDK provider is installed and callers
skip span creation on a boolean (`Tracing.enabled`), so the hot path pays nothing. Spans never
touch output bytes: outputs carry the input's traceparent verbatim, with or without tracing.

Fed with an event's coordinates and the engine's and intake's own values, so it knows nothing
of Kafka records.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.semconv._incubating.attributes.messaging_attributes import (
    MESSAGING_CONSUMER_GROUP_NAME,
    MESSAGING_DESTINATION_NAME,
    MESSAGING_DESTINATION_PARTITION_ID,
    MESSAGING_KAFKA_MESSAGE_KEY,
    MESSAGING_KAFKA_OFFSET,
    MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE,
    MESSAGING_SYSTEM,
)
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
)
from opentelemetry.semconv.attributes.url_attributes import URL_PATH
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from context_assembler.engine import Assembly
from context_assembler.intake.codec import RejectedInput

log = logging.getLogger(__name__)
ENDPOINT_VARIABLE = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE = "context-assembler"
_PROPAGATED = ("traceparent", "tracestate")  # W3C TraceContext's two headers
_PROPAGATOR = TraceContextTextMapPropagator()


class Tracing:
    """Makes the spans of events; `enabled` is False when no provider was given."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.enabled = provider is not None
        self._provider = provider
        self._tracer: Tracer | None = provider.get_tracer(__name__) if provider else None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Tracing:
        """Exporting over OTLP/HTTP to OTEL_EXPORTER_OTLP_ENDPOINT if set, else off. The
        exporter reads its other OTEL_EXPORTER_OTLP_* settings itself."""
        if not environ.get(ENDPOINT_VARIABLE):
            return cls(None)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        log.info("tracing to %s", environ[ENDPOINT_VARIABLE])
        return cls.with_processor(BatchSpanProcessor(OTLPSpanExporter()))

    @classmethod
    def with_processor(cls, processor: SpanProcessor) -> Tracing:
        """On, handing ended spans to `processor` (tests: an in-memory exporter)."""
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: SERVICE}))
        provider.add_span_processor(processor)
        return cls(provider)

    def begin(
        self, topic: str, partition: int, offset: int, key: bytes | None,
        headers: Sequence[tuple[str, bytes]], group: str, start_ns: int,
    ) -> Span:
        """The event's CONSUMER span, a child of the input's traceparent if it has a valid one.
        Only call when `enabled`."""
        assert self._tracer is not None, "tracing is off: check Tracing.enabled first"
        carrier = [
            (name, value.decode("latin-1")) for name, value in headers
            if name.lower() in _PROPAGATED
        ]
        attributes: dict[str, str | int] = {
            MESSAGING_SYSTEM: "kafka",
            MESSAGING_OPERATION_TYPE: "process",
            MESSAGING_OPERATION_NAME: "process",
            MESSAGING_DESTINATION_NAME: topic,
            MESSAGING_DESTINATION_PARTITION_ID: str(partition),
            MESSAGING_KAFKA_OFFSET: offset,
            MESSAGING_CONSUMER_GROUP_NAME: group,
        }
        text_key = _text(key)
        if text_key is not None:
            attributes[MESSAGING_KAFKA_MESSAGE_KEY] = text_key
        return self._tracer.start_span(
            f"process {topic}", context=_parent(carrier), kind=SpanKind.CONSUMER,
            attributes=attributes, start_time=start_ns,
        )

    def begin_request(
        self, method: str, route: str, headers: Mapping[str, str], start_ns: int
    ) -> Span:
        """An HTTP request's SERVER span, a child of its traceparent if it has a valid one.
        Only call when `enabled`."""
        assert self._tracer is not None, "tracing is off: check Tracing.enabled first"
        attributes = {HTTP_REQUEST_METHOD: method, HTTP_ROUTE: route, URL_PATH: route}
        return self._tracer.start_span(
            f"{method} {route}", context=_parent(headers.items()), kind=SpanKind.SERVER,
            attributes=attributes, start_time=start_ns,
        )

    @staticmethod
    def responded(span: Span, status: int) -> None:
        """The response's status; a 5xx is the server's error (a 4xx is the client's)."""
        span.set_attribute(HTTP_RESPONSE_STATUS_CODE, status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))

    def child(self, parent: Span, name: str, start_ns: int) -> Span:
        """A step of the event (assemble, publish) under its span."""
        assert self._tracer is not None, "tracing is off: check Tracing.enabled first"
        context: Context = set_span_in_context(parent)
        return self._tracer.start_span(name, context=context, start_time=start_ns)

    @staticmethod
    def assembled(span: Span, assembly: Assembly | None, rejected: RejectedInput | None) -> None:
        """The engine's figures, or the reason the event was rejected (an error status)."""
        if rejected is not None:
            span.set_attribute("context_assembler.outcome", "rejected")
            span.set_attribute("context_assembler.reject.reason", rejected.reason)
            span.set_status(Status(StatusCode.ERROR, f"{rejected.reason}: {rejected.message}"))
            return
        span.set_attribute("context_assembler.outcome", "assembled")
        if assembly is None:  # the benchmark's passthrough
            return
        audit = assembly.audit
        span.set_attribute("context_assembler.request_id", audit.request_id)
        span.set_attribute("context_assembler.kept", len(audit.kept))
        span.set_attribute("context_assembler.dropped", len(audit.dropped))
        span.set_attribute("context_assembler.tokens.context", audit.tokens.context)
        span.set_attribute("context_assembler.tokens.prompt", audit.tokens.prompt)
        span.set_attribute("context_assembler.policy.name", audit.policy.name)
        span.set_attribute("context_assembler.policy.hash", audit.policy.hash)

    @staticmethod
    def failed(span: Span, error: BaseException) -> None:
        """The event's outputs were not acknowledged (the worker stopped, or a transaction
        was aborted): the next owner of its partition, or a retry, redoes it."""
        span.set_status(Status(StatusCode.ERROR, f"not delivered: {error!r}"))

    def shutdown(self) -> None:
        """Export what is still buffered; called once, at exit."""
        if self._provider is not None:
            self._provider.shutdown()


def _parent(headers: Iterable[tuple[str, str]]) -> Context:
    """The context the W3C TraceContext headers among `headers` carry (none or invalid: a
    new trace)."""
    carrier = {name.lower(): value for name, value in headers if name.lower() in _PROPAGATED}
    return _PROPAGATOR.extract(carrier)


def _text(key: bytes | None) -> str | None:
    """A key's string form if it has an unambiguous one (UTF-8), as semconv asks."""
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None
