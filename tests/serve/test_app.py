"""The HTTP endpoint on a real socket (127.0.0.1, a free port): the file mode's bytes,
a JSON reason for every rejection, the worker's metrics, and its OpenAPI document."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from context_assembler import filemode
from context_assembler.engine import Assembly
from context_assembler.filemode import BOM
from context_assembler.generate.schemas import openapi
from context_assembler.intake.codec import Limits
from context_assembler.intake.handle import assemble_bytes
from context_assembler.intake.policy_registry import PolicyRegistry, build_registry
from context_assembler.observability.tracing import Tracing
from context_assembler.serve.app import JSON, MESSAGE_CHARS, QUOTED_CHARS, Server, Service, body
from context_assembler.settings import Settings
from tests.factories import EXAMPLES
from tests.test_layers import PROJECT_IMPORTS

PUBLISHED_OPENAPI = Path(__file__).resolve().parents[2] / "schemas" / "openapi.json"

LIMITS = Limits(max_event_bytes=64 * 1024, max_chunks=20, max_chunk_chars=5000)


def served_under(**options: Any) -> Settings:
    """serve's settings: LIMITS, and `options`."""
    return Settings(**LIMITS.model_dump(), **options)
LINES = (EXAMPLES / "events.jsonl").read_bytes().splitlines()
GOOD = LINES[1]  # q30-customer


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Service, Server]]:
    """A server on a free port; parametrized `indirect`, the param is the Service's options."""
    options: dict[str, Any] = getattr(request, "param", {})
    service = Service(build_registry(None, ["window-8k"]), served_under(**options))
    running = Server(service, "127.0.0.1", 0)
    await running.start()
    try:
        yield service, running
    finally:
        await running.stop()


@pytest.fixture
def served(server: tuple[Service, Server]) -> tuple[Service, str]:
    service, running = server
    return service, f"http://127.0.0.1:{running.port}"


async def post(url: str, data: bytes, **headers: str) -> tuple[int, bytes, dict[str, str]]:
    """A POST declaring JSON unless `headers` say otherwise (aiohttp would say octet-stream)."""
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/assemble", data=data, headers={"Content-Type": JSON, **headers}
    ) as response:
        return response.status, await response.read(), dict(response.headers)


async def get(url: str, path: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}{path}") as response:
        return response.status, await response.read()


def file_mode(registry_allowed: list[str]) -> list[bytes]:
    """{"prompt": ..., "audit": ...} for each example line, from the file mode's own output."""
    prompts, audits, errors = io.BytesIO(), io.BytesIO(), io.BytesIO()
    filemode.run([("events.jsonl", io.BytesIO(b"\n".join(LINES)))],
                 build_registry(None, registry_allowed), LIMITS,
                 prompts=prompts, audits=audits, errors=errors)
    assert errors.getvalue() == b""
    return [b'{"prompt":' + p + b',"audit":' + a + b"}" for p, a in
            zip(prompts.getvalue().splitlines(), audits.getvalue().splitlines(), strict=True)]


async def test_every_example_gives_the_file_modes_bytes(served: tuple[Service, str]) -> None:
    _, url = served
    expected = file_mode(["window-8k"])
    assert len(expected) == len(LINES) == 8
    for line, want in zip(LINES, expected, strict=True):
        status, body, headers = await post(url, line)
        assert (status, body) == (200, want)
        assert headers["Content-Type"].startswith("application/json")
        parsed = json.loads(body)
        assert parsed["prompt"]["request_id"] == parsed["audit"]["request_id"]


@pytest.mark.parametrize(
    ("data", "status", "reason", "says"),
    [
        (b"{bad", 400, "json", "not valid JSON"),
        (b'{"request_id": "a", "request_id": "b", "question": "q"}', 400, "json", "duplicate key"),
        (b"\xff\xfe", 400, "json", "UTF-8"),
        (b'{"request_id": "r", "chunks": []}', 422, "schema", "question"),
        (b'{"request_id": "r", "question": "q", "history": [{"role": "system", "content": "x"}]}',
         422, "schema", "history"),
        (json.dumps({"request_id": "r", "question": "q",
                     "chunks": [{"chunk_id": f"c{i}", "text": "t"} for i in range(21)]}).encode(),
         422, "limits", "max_chunks=20"),
        (json.dumps({"request_id": "r", "question": "q",
                     "chunks": [{"chunk_id": "c", "text": "t" * 5001}]}).encode(),
         422, "limits", "max_chunk_chars=5000"),
        (b'{"request_id": "r", "question": "q", "policy": "rank-fidelity"}', 422, "policy",
         "not allowed"),
        (b" " * (64 * 1024 + 1), 413, "limits", "max_event_bytes=65536"),
    ],
    ids=["json", "duplicate-key", "utf8", "schema", "system-history", "max-chunks",
         "chunk-chars", "policy", "oversized"],
)
async def test_bad_input_is_a_4xx_with_its_reason(
    served: tuple[Service, str], data: bytes, status: int, reason: str, says: str
) -> None:
    _, url = served
    got, body, _ = await post(url, data)
    error = json.loads(body)
    assert (got, error["reason"]) == (status, reason)
    assert says in error["message"]
    assert set(error) == {"reason", "message", "request_id"}


async def test_an_oversized_chunked_body_is_refused_without_a_length(
    served: tuple[Service, str],
) -> None:
    _, url = served

    async def stream() -> AsyncIterator[bytes]:  # no Content-Length: read until over the limit
        for _ in range(100):
            yield b" " * 1024

    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/assemble", data=stream(), headers={"Content-Type": JSON}
    ) as response:
        assert response.status == 413
        error = await response.json()
    assert error["reason"] == "limits"
    assert error["message"] == ("body is over max_event_bytes=65536 (sent without a "
                                "Content-Length: reading stopped)")


async def test_a_gzip_body_over_the_limit_once_decoded_is_refused_with_that_figure(
    served: tuple[Service, str],
) -> None:
    _, url = served
    packed = gzip.compress(b" " * (64 * 1024 + 1))  # a few hundred bytes on the wire
    status, body, _ = await post(url, packed, **{"Content-Encoding": "gzip"})
    error = json.loads(body)
    assert (status, error["reason"]) == (413, "limits")
    assert error["message"] == ("body is over max_event_bytes=65536 once decoded "
                                "(Content-Encoding 'gzip')")
    assert str(len(packed)) not in error["message"]


async def test_an_engine_bug_is_a_500_and_the_next_request_is_served(
    served: tuple[Service, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = served

    def broken(*_: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("context_assembler.intake.handle.assemble", broken)
    status, body, _ = await post(url, GOOD)
    assert status == 500
    assert json.loads(body) == {"reason": "engine", "message": "RuntimeError: boom",
                                "request_id": "q30-customer"}
    monkeypatch.undo()
    assert (await post(url, GOOD))[0] == 200


async def test_requests_over_max_pending_get_503_until_the_engine_frees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    entered = threading.Event()

    def held(raw: bytes, registry: PolicyRegistry, limits: Limits) -> Assembly:
        entered.set()
        release.wait(10)
        return assemble_bytes(raw, registry, limits)

    monkeypatch.setattr("context_assembler.serve.app.assemble_bytes", held)
    service = Service(build_registry(None), served_under(max_pending=1))
    server = Server(service, "127.0.0.1", 0)
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        first = asyncio.create_task(post(url, GOOD))
        await asyncio.to_thread(entered.wait, 10)
        status, body, headers = await post(url, GOOD)
        assert (status, headers["Retry-After"]) == (503, "1")
        assert "busy" in json.loads(body)["message"]
        release.set()
        assert (await first)[0] == 200
        assert (await post(url, GOOD))[0] == 200
    finally:
        release.set()
        await server.stop()


async def test_metrics_count_requests_by_outcome(served: tuple[Service, str]) -> None:
    service, url = served
    await post(url, GOOD)
    await post(url, GOOD)
    await post(url, b"{bad")
    await post(url, b" " * (64 * 1024 + 1))
    status, page = await get(url, "/metrics")
    assert status == 200
    text = page.decode()
    assert 'context_assembler_events_total{outcome="assembled"} 2.0' in text
    assert 'context_assembler_events_total{outcome="rejected"} 2.0' in text
    assert 'context_assembler_chunks_total{decision="access_denied"} 2.0' in text
    samples = service.metrics.registry.get_sample_value
    assert samples("context_assembler_assembly_duration_seconds_count") == 4
    # answered with an error, not dead-lettered: nothing in the worker's DLQ counter
    assert samples("context_assembler_http_rejections_total", {"reason": "json"}) == 1
    assert samples("context_assembler_http_rejections_total", {"reason": "limits"}) == 1
    assert samples("context_assembler_dlq_records_total", {"reason": "json"}) is None


async def test_health_ready_and_the_openapi_document(served: tuple[Service, str]) -> None:
    service, url = served
    assert await get(url, "/health") == (200, b'{"status": "ok"}')
    assert await get(url, "/ready") == (200, b'{"ready": true}')
    status, document = await get(url, "/openapi.json")
    assert status == 200
    assert json.loads(document) == json.loads(PUBLISHED_OPENAPI.read_bytes())
    assert service.metrics.registry.get_sample_value("context_assembler_ready") == 1
    service.ready = False
    assert (await get(url, "/ready"))[0] == 503
    assert service.metrics.registry.get_sample_value("context_assembler_ready") == 0


async def test_a_valid_traceparent_comes_back_and_a_forged_one_does_not(
    served: tuple[Service, str],
) -> None:
    _, url = served
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert (await post(url, GOOD, traceparent=trace))[2]["traceparent"] == trace
    assert "traceparent" not in (await post(url, GOOD, traceparent="00-not-a-trace"))[2]


@pytest.mark.parametrize(("method", "path", "status", "allow", "said"), [
    ("GET", "/v2/assemble", 404, None, "no such path '/v2/assemble'; paths: /health, /metrics, "
                                       "/openapi.json, /ready, /v1/assemble"),
    ("GET", "/" + "x" * 5000, 404, None, f"no such path '/{'x' * (QUOTED_CHARS - 1)}... (5001"),
    ("GET", "/v1/assemble", 405, "POST", "GET is not allowed on /v1/assemble; allowed: POST"),
    ("POST", "/health", 405, "GET,HEAD", "POST is not allowed on /health; allowed: GET, HEAD"),
], ids=["unknown-path", "long-path", "get-assemble", "post-health"])
async def test_unknown_paths_and_methods_are_answered_in_json(
    served: tuple[Service, str], method: str, path: str, status: int, allow: str | None,
    said: str,
) -> None:
    _, url = served
    async with aiohttp.ClientSession() as session, session.request(
        method, f"{url}{path}"
    ) as response:
        assert response.status == status
        assert response.content_type == JSON
        assert response.headers.get("Allow") == allow
        error = json.loads(await response.read())
    assert set(error) == {"message"}
    assert error["message"].startswith(said)
    assert len(error["message"]) < 2 * QUOTED_CHARS + 100  # the client's path, cut


def test_the_openapi_document_names_the_contracts_models() -> None:
    document = openapi()
    operation = document["paths"]["/v1/assemble"]["post"]
    assert document["openapi"] == "3.1.0"
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/RetrievalResult"}
    assembled = document["components"]["schemas"]["Assembled"]["properties"]
    assert assembled == {"prompt": {"$ref": "#/components/schemas/AssembledPrompt"},
                         "audit": {"$ref": "#/components/schemas/AssemblyAudit"}}
    assert {"200", "400", "408", "413", "415", "422", "503"} <= set(operation["responses"])
    for ref in _refs(document):  # every reference resolves inside the document
        target: Any = document
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_the_endpoint_imports_only_the_workers_sensors_of_kafka() -> None:
    kafka = [str(found) for found in PROJECT_IMPORTS
             if found.importer.startswith("context_assembler.serve")
             and found.target.startswith("context_assembler.kafka")
             and not found.target.startswith("context_assembler.observability")]
    assert kafka == []


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def test_each_request_is_a_server_span_under_the_callers_trace() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing.with_processor(SimpleSpanProcessor(exporter))
    service = Service(build_registry(None, ["window-8k"]), served_under(), tracing=tracing)
    server = Server(service, "127.0.0.1", 0)
    await server.start()
    url = f"http://127.0.0.1:{server.port}"
    try:
        assert (await post(url, GOOD, traceparent=CALLER))[0] == 200
        assert (await post(url, b"{bad"))[0] == 400
        assert (await post(url, b" " * (64 * 1024 + 1)))[0] == 413
    finally:
        await server.stop()
    spans = exporter.get_finished_spans()
    requests = [span for span in spans if span.kind is SpanKind.SERVER]
    attributes = [dict(span.attributes or {}) for span in requests]
    assert [each["http.response.status_code"] for each in attributes] == [200, 400, 413]
    assert {span.name for span in requests} == {"POST /v1/assemble"}
    good, bad, _ = requests
    assert f"{good.context.trace_id:032x}" == TRACE_ID  # continues the caller's trace
    assert f"{bad.context.trace_id:032x}" != TRACE_ID  # no traceparent: a trace of its own
    assert attributes[0]["context_assembler.outcome"] == "assembled"
    assert attributes[0]["context_assembler.request_id"] == "q30-customer"
    assert attributes[1]["context_assembler.reject.reason"] == "json"
    assert "context_assembler.outcome" not in attributes[2]  # refused unread
    steps = [span for span in spans if span.name == "assemble"]
    assert [step.parent.span_id for step in steps if step.parent] == [
        good.context.span_id, bad.context.span_id,
    ]


async def raw_exchange(port: int, data: bytes) -> bytes:
    """`data` as it is on one connection, then what the server answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def head_and_body(answer: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}
    return status.encode(), headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [b"GARBAGE /v1/assemble HTTP/1.1\r\nHost: x\r\n\r\n",
     b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\nContent-Length: lots\r\n\r\n",
     b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\nX-Long: " + b"y" * 9000 + b"\r\n\r\n",
     b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"],
    ids=["method", "content-length", "long-header", "chunk-size"],
)
async def test_a_request_aiohttp_cannot_parse_gets_the_rejection_shape(
    server: tuple[Service, Server], request_bytes: bytes
) -> None:
    _, running = server
    assert running.port is not None
    status, headers, body = head_and_body(await raw_exchange(running.port, request_bytes))
    assert status.split()[1] == b"400", status
    assert headers["content-type"].startswith("application/json")
    error = json.loads(body)
    assert set(error) == {"reason", "message", "request_id"}
    assert error["reason"] == "json"
    for quoted in (b"GARBAGE", b"lots", b"yyyy", b"zz"):  # never the request's own bytes
        assert quoted.decode() not in error["message"]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [("text/plain", 415), ("application/x-www-form-urlencoded", 415),
     ("application/octet-stream", 415), ("application/json; charset=utf-16", 415),
     ("application/json; charset=UTF-8", 200), ("application/problem+json", 200), (None, 200)],
)
async def test_only_a_body_declared_as_json_is_assembled(
    served: tuple[Service, str], content_type: str | None, status: int
) -> None:
    _, url = served
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/assemble", data=GOOD,
        headers={"Content-Type": content_type} if content_type else {},
        skip_auto_headers=["Content-Type"],
    ) as response:
        assert response.status == status
        answer = await response.json()
    if status == 415:
        assert answer["reason"] == "json"
        assert "send application/json" in answer["message"]


async def test_a_bom_opening_the_body_is_dropped_as_the_file_mode_drops_it(
    served: tuple[Service, str],
) -> None:
    _, url = served
    expected = file_mode(["window-8k"])[1]
    assert await post(url, BOM + GOOD) == (200, expected, mock.ANY)
    status, body, _ = await post(url, b" " + BOM + GOOD)  # only where the body opens
    assert (status, json.loads(body)["reason"]) == (400, "json")
    # the mark is not counted against max_event_bytes, as on a file's first line
    padded = GOOD + b" " * (64 * 1024 - len(GOOD))
    assert (await post(url, BOM + padded))[0] == 200
    assert (await post(url, BOM + padded + b" "))[0] == 413


@pytest.mark.parametrize(
    "given",
    ["00-not-a-trace", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
     "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
     "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
     "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", "00-" + "a" * 5000],
    ids=["garbage", "version-ff", "zero-trace", "zero-parent", "upper-case", "long"],
)
async def test_an_invalid_traceparent_is_neither_echoed_nor_logged(
    served: tuple[Service, str], caplog: pytest.LogCaptureFixture, given: str
) -> None:
    _, url = served
    with caplog.at_level(logging.DEBUG, "context_assembler.serve.app"):
        status, _, headers = await post(url, b"{bad", traceparent=given)
    assert status == 400
    assert "traceparent" not in headers
    assert [getattr(record, "traceparent", None) for record in caplog.records] == [None]


async def test_a_rejection_quotes_at_most_a_kib_of_the_request(
    served: tuple[Service, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = served
    key = "k" * 50_000
    cases = [
        (b'{"request_id": "r", "question": "q", "' + key.encode() + b'": 1, "'
         + key.encode() + b'": 2}', {}),
        (json.dumps({"request_id": "r", "question": "q", "policy": key}).encode(), {}),
        (GOOD, {"Content-Type": "text/" + key}),
        (gzip.compress(b" " * 70_000), {"Content-Encoding": "gzip, " + "br, " * 1000}),
    ]
    for data, headers in cases:
        caplog.clear()
        status, body, _ = await post(url, data, **headers)
        assert status in (400, 413, 415, 422)
        message = json.loads(body)["message"]
        assert len(message) <= MESSAGE_CHARS + 40, status
        assert len(body) <= MESSAGE_CHARS * 6 + 200  # JSON escapes, the other two fields
        assert all(len(record.getMessage()) <= MESSAGE_CHARS + 60 for record in caplog.records)


STALLED = 64


async def stall(port: int, sent: bytes = b'{"request_id"', length: int = 1000
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends a head announcing `length` bytes and only `sent` of them."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (length, sent))
    await writer.drain()
    return reader, writer


async def answer_on(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the response that arrives on a raw connection."""
    async with asyncio.timeout(30):
        head = await reader.readuntil(b"\r\n\r\n")
        _, headers, _ = head_and_body(head)
        body = await reader.readexactly(int(headers["content-length"]))
    return int(head.split()[1]), json.loads(body)


async def until(condition: Callable[[], bool], seconds: float = 30) -> None:
    """Poll `condition` until it holds; fail after a generous `seconds`."""
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("server", [{"body_timeout_seconds": 4.0}], indirect=True)
async def test_stalled_bodies_cannot_starve_the_endpoint_and_get_408(
    server: tuple[Service, Server],
) -> None:
    service, running = server
    assert running.port is not None
    samples = service.metrics.registry.get_sample_value
    reading = {"stage": "reading"}
    connections = [await stall(running.port) for _ in range(STALLED)]
    try:
        await until(lambda: samples("context_assembler_http_pending_requests", reading) == STALLED)
        for _ in range(3):  # as many stalled bodies as --max-pending hold no slot
            assert (await post(f"http://127.0.0.1:{running.port}", GOOD))[0] == 200
        assert samples("context_assembler_http_pending_requests", reading) == STALLED
        for reader, _ in connections:
            status, error = await answer_on(reader)
            assert (status, error["reason"]) == (408, "limits")
        assert samples("context_assembler_http_slow_clients_total") == STALLED
        assert samples("context_assembler_http_busy_total") == 0  # not back-pressure
        assert samples("context_assembler_http_pending_requests", reading) == 0
        assert samples("context_assembler_events_total", {"outcome": "assembled"}) == 3
    finally:
        for _, writer in connections:
            writer.close()


@pytest.mark.parametrize("server", [{"body_timeout_seconds": 2.0, "max_pending": 1}], indirect=True)
async def test_the_bodies_held_at_once_are_bounded_in_bytes_as_they_arrive(
    server: tuple[Service, Server],
) -> None:
    service, running = server  # room for 1 x 64 KiB of bodies
    assert running.port is not None
    held = service.metrics.registry.get_sample_value
    first = await stall(running.port, b" " * 40_000, 60_000)
    await until(lambda: held("context_assembler_http_body_bytes") == 40_000)
    second = await stall(running.port, b" " * 40_000, 60_000)
    try:
        status, busy = await answer_on(second[0])
        assert status == 503 and "busy" in busy["message"]
        assert (await post(f"http://127.0.0.1:{running.port}", GOOD))[0] == 200  # room for it
        assert (await answer_on(first[0]))[0] == 408
        assert held("context_assembler_http_body_bytes") == 0
    finally:
        first[1].close()
        second[1].close()


@pytest.mark.parametrize("server", [{"max_pending": 1, "idle_timeout_seconds": 0.5}], indirect=True)
async def test_a_connection_that_never_finishes_its_head_is_closed_without_a_slot(
    server: tuple[Service, Server],
) -> None:
    _, running = server
    assert running.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    writer.write(b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\n")  # and no blank line
    assert (await post(f"http://127.0.0.1:{running.port}", GOOD))[0] == 200
    assert await asyncio.wait_for(reader.read(), 30) == b""  # closed by the server
    writer.close()


def adversarial(request_id: str = "r", chunk_id: str = "c", chunks: int = 20,
                audience: str | None = None) -> bytes:
    """A small event whose untrusted strings an answer could copy once per chunk."""
    restricted = {} if audience is None else {"audience": ["staff"]}
    return json.dumps({"request_id": request_id, "question": "what is the refund window?",
                       **({} if audience is None else {"audience": audience}),
                       "chunks": [{"chunk_id": f"{chunk_id}{i}", "text": "refunds: 30 days",
                                   **restricted} for i in range(chunks)]}).encode()


@pytest.mark.parametrize(
    "data",
    [adversarial(request_id="r" * 20_000), adversarial(chunk_id="k" * 250),
     adversarial(request_id="\u2028" * 2000, chunk_id="\u00e9" * 100),
     adversarial(audience="a" * 20_000)],
    ids=["long-request-id", "long-chunk-ids", "escaped-characters", "long-audience"],
)
async def test_an_answer_is_a_small_multiple_of_its_request(
    served: tuple[Service, str], data: bytes
) -> None:
    _, url = served
    status, body, _ = await post(url, data)
    assert status == 200
    assert len(body) <= 8 * len(data) + 16 * 1024


async def test_an_unexpected_error_answering_is_a_500_in_the_rejection_shape(
    served: tuple[Service, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = served

    async def broken(*_: object) -> None:
        raise LookupError("a secret of the server's")

    monkeypatch.setattr("context_assembler.serve.app.Endpoint._respond", broken)
    status, body, headers = await post(url, GOOD)
    assert status == 500 and headers["Content-Type"].startswith(JSON)
    error = json.loads(body)
    assert error == {"reason": "engine", "message": "unexpected error (LookupError); it is in the "
                     "server's log", "request_id": None}


async def test_a_client_that_does_not_read_its_answer_is_cut_off() -> None:
    # An answer of about 10 MB, more than the kernel's send buffer (up to 4 MiB) holds: 2,000
    # copies of one text, each dropped with its long document named.
    service = Service(build_registry(None, ["window-8k"]),
                      Settings(max_event_bytes=16 << 20, body_timeout_seconds=2.0))
    event = json.dumps({"request_id": "r", "question": "what is the refund window?", "chunks": [
        {"chunk_id": f"k{i}", "doc_id": f"{'d' * 4000}{i}", "text": "refunds: 30 days"}
        for i in range(2000)]}).encode()
    answer = body(assemble_bytes(event, service.registry, service.limits))
    server = Server(service, "127.0.0.1", 0)
    await server.start()
    assert server.port is not None
    loop = asyncio.get_running_loop()
    with socket.socket() as connection:
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        connection.setblocking(False)
        try:
            await loop.sock_connect(connection, ("127.0.0.1", server.port))
            await loop.sock_sendall(connection, b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Length: %d\r\n\r\n%s" % (len(event), event))
            slow = service.metrics.registry.get_sample_value
            await until(lambda: slow("context_assembler_http_slow_clients_total") == 1, 60)
            received = 0
            with contextlib.suppress(ConnectionResetError):
                async with asyncio.timeout(30):
                    while part := await loop.sock_recv(connection, 1 << 16):
                        received += len(part)
            assert 0 < received < len(answer)  # the rest never held for it
            assert service.metrics.registry.get_sample_value("context_assembler_http_body_bytes") == 0
        finally:
            await server.stop()


async def test_expect_100_continue_over_the_limit_is_answered_413_without_100_continue(
    server: tuple[Service, Server],
) -> None:
    """The client waits for `100 Continue` before sending 2 GB: it gets the 413 first, and
    nothing is read."""
    _, running = server
    assert running.port is not None
    answer = await raw_exchange(running.port, (
        b"POST /v1/assemble HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2147483648\r\nExpect: 100-continue\r\n\r\n"))
    assert not answer.startswith(b"HTTP/1.1 100"), answer[:200]
    status, _, body = head_and_body(answer)
    assert status.split()[1] == b"413", status
    assert json.loads(body)["reason"] == "limits"
    assert "2147483648 bytes, over max_event_bytes" in json.loads(body)["message"]


async def test_expect_100_continue_within_the_limit_is_continued_and_assembled(
    served: tuple[Service, str],
) -> None:
    _, url = served
    status, data, _ = await post(url, GOOD, Expect="100-continue")
    assert status == 200 and json.loads(data)["prompt"]["request_id"]


@pytest.mark.parametrize("target", [b"/v1/assemble?\x01", b"http://[/", b"/%", b"\x7f",
                                    b"/v1/assemble#\x00"])
async def test_a_head_request_gets_no_body_whatever_its_target(
    server: tuple[Service, Server], target: bytes,
) -> None:
    _, running = server
    assert running.port is not None
    answer = await raw_exchange(
        running.port, b"HEAD " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, _, body = head_and_body(answer)
    assert status.split()[1].startswith(b"4"), status
    assert body == b"", answer


async def test_a_head_after_another_request_on_the_connection_gets_no_body(
    server: tuple[Service, Server],
) -> None:
    _, running = server
    assert running.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answered = await reader.readuntil(b'{"status": "ok"}')
        writer.write(b"HEAD /v1/assemble?\x01 HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    assert answered.startswith(b"HTTP/1.1 200")
    status, _, body = head_and_body(answer)
    assert status.split()[1] == b"400" and body == b"", answer


async def test_pipelined_requests_aiohttp_cannot_parse_are_answered_as_the_first_of_them(
    server: tuple[Service, Server],
) -> None:
    """aiohttp answers data it cannot parse once, for the first request in it: a body unless
    that one is a HEAD."""
    _, running = server
    assert running.port is not None
    get, bad_head = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"HEAD /v1/assemble?\x01 HTTP/1.1\r\nHost: x\r\n\r\n")
    for data, bodiless in ((bad_head + get, True), (get + bad_head, False)):
        status, headers, body = head_and_body(await raw_exchange(running.port, data))
        assert status.split()[1] == b"400"
        assert (body == b"") is bodiless and int(headers["content-length"]) == len(body)
