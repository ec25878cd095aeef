"""`POST /v1/assemble`: one RetrievalResult in, `{prompt, audit}` out, the file mode's bytes.
`POST /v1/citations/check`: a prompt and its answer in, the CitationCheck out.

The same intake as every other shell (limits, the policy allow-list, the same rejections),
the engine in one thread off the event loop as in the worker, the worker's metrics, and a
SERVER span per request (with an "assemble" child) continuing the caller's traceparent when
tracing is on. A body announced over max_event_bytes is refused unread, and reading stops
one chunk past it, so an oversized body is never held in memory.

Slow clients cannot hold the endpoint: the bodies held at once are bounded in bytes as they
arrive, not by how many requests are reading, so a client that stalls holds only what it
sent; a body must arrive within `body_timeout` of its head (else 408) and its answer be read
within as long again (else the connection is closed), and a connection must send a complete
request head within `idle_timeout` of opening or of its last response (else it is closed).
Every answer, aiohttp's own 400s included, is JSON in one shape (its 404 and 405, like the
503, carry only the shape's `message`), and quotes an untrusted string only cut to a fixed
length.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from logging import Logger
from typing import Final, cast

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from aiohttp.web_urldispatcher import _default_expect_handler  # the one aiohttp answers with
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge

from context_assembler.contract.models import RejectReason
from context_assembler.engine import Assembly
from context_assembler.filemode import BOM
from context_assembler.intake import citations
from context_assembler.intake.codec import Limits, RejectedInput, encode
from context_assembler.intake.handle import assemble_bytes
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.observability.metrics import Metrics
from context_assembler.observability.traceparent import valid_traceparent
from context_assembler.observability.tracing import Tracing
from context_assembler.settings import Settings

log = logging.getLogger(__name__)

ASSEMBLE_PATH: Final = "/v1/assemble"
CITATIONS_PATH: Final = "/v1/citations/check"
JSON: Final = "application/json"
_STATUS: Final = {
    RejectReason.JSON: 400,
    RejectReason.ENGINE: 500,  # a bug, not the client's
}
# Of a rejection's message in a response or a log line: messages may quote the request.
MESSAGE_CHARS: Final = 1024
# /openapi.json: the document `make schemas` writes beside this module (schemas/openapi.json's
# bytes), compacted once at import; nothing here builds it from the models.
_OPENAPI_FILE: Final = resources.files("context_assembler.serve").joinpath("openapi.json")
OPENAPI: Final = json.dumps(json.loads(_OPENAPI_FILE.read_bytes()), sort_keys=True).encode()
QUOTED_CHARS: Final = 100  # of a header quoted in a message
_UNPARSED: Final = "UNKNOWN"  # the method of what aiohttp could not parse as a request


@dataclass
class Service:
    """What the endpoint needs: the operator's policies, the settings it serves under (the
    limits, max_pending, the body and idle timeouts), and where to count."""

    registry: PolicyRegistry
    settings: Settings = field(default_factory=Settings)
    metrics: Metrics = field(default_factory=Metrics)
    tracing: Tracing = field(default_factory=Tracing)  # off unless given a provider
    ready: bool = True
    limits: Limits = field(init=False)  # the settings', built once
    slow_clients: Counter = field(init=False)
    busy: Counter = field(init=False)
    pending: Gauge = field(init=False)
    body_bytes: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self.limits = self.settings.limits
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)
        registry = self.metrics.registry
        self.slow_clients = Counter(
            "context_assembler_http_slow_clients_total",
            "Requests whose body did not arrive, or whose response was not read, within the "
            "body timeout (408, or the connection closed).",
            registry=registry,
        )
        self.busy = Counter(
            "context_assembler_http_busy_total",
            "Requests refused (503) because max_pending requests were pending.",
            registry=registry,
        )
        self.pending = Gauge(
            "context_assembler_http_pending_requests",
            "Requests by stage: reading the body, or waiting for or at the engine.",
            ["stage"], registry=registry,
        )
        self.body_bytes = Gauge(
            "context_assembler_http_body_bytes",
            "Bytes of request bodies held: read so far, or waiting for the engine.",
            registry=registry,
        )


def body(assembly: Assembly) -> bytes:
    """The prompt and the audit, each exactly as the file mode encodes it."""
    return b'{"prompt":' + encode(assembly.prompt) + b',"audit":' + encode(assembly.audit) + b"}"


def _cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _rejection(rejected: RejectedInput, status: int) -> web.Response:
    payload = {"reason": rejected.reason.value, "message": _cut(rejected.message, MESSAGE_CHARS),
               "request_id": rejected.request_id}
    return web.json_response(payload, status=status)


class _Busy(Exception):
    """Back-pressure: the engine's queue is full, or the bodies held are."""


class _BodyBytes:
    """The bytes of request bodies held at once, taken as they arrive (not as announced), so
    a client that stalls holds only what it sent; a request that would pass the capacity
    is busy."""

    def __init__(self, capacity: int, gauge: Gauge) -> None:
        self.capacity = capacity
        self.held = 0
        self._gauge = gauge

    @contextlib.contextmanager
    def holding(self) -> Iterator[Callable[[int], None]]:
        """`take(size)` for one request's body; all it took is given back on leaving."""
        taken = 0

        def take(size: int) -> None:
            nonlocal taken
            if self.held + size > self.capacity:
                raise _Busy
            self.held += size
            taken += size
            self._gauge.set(self.held)

        try:
            yield take
        finally:
            self.held -= taken
            self._gauge.set(self.held)


class _Refused(Exception):
    """A request answered before the engine sees it: its status and why."""

    def __init__(self, status: int, rejected: RejectedInput) -> None:
        super().__init__(rejected.message)
        self.status = status
        self.rejected = rejected


def _header(request: web.BaseRequest, name: str) -> str:
    return repr(_cut(request.headers.get(name, ""), QUOTED_CHARS))


def _refuse_non_json(request: web.BaseRequest) -> None:
    """A body declared as anything but JSON in UTF-8 is refused (415); none declared is
    taken for JSON."""
    if hdrs.CONTENT_TYPE not in request.headers:
        return
    kind = request.content_type
    json_kind = kind == JSON or (kind.startswith("application/") and kind.endswith("+json"))
    if json_kind and (request.charset or "utf-8").lower() == "utf-8":
        return
    raise _Refused(415, RejectedInput(
        RejectReason.JSON, f"Content-Type {_header(request, hdrs.CONTENT_TYPE)} is not JSON in "
        f"UTF-8; send {JSON}"))


def _oversized(request: web.BaseRequest, limit: int, read: bool) -> _Refused:
    """413, with the figure that is true of this body: its announced length, else the limit
    that reading it passed (after decoding, for a compressed body)."""
    length = request.content_length
    bound = (f"max_event_bytes={limit}" if request.path == ASSEMBLE_PATH
             else f"{limit} (twice max_event_bytes)")
    if read and hdrs.CONTENT_ENCODING in request.headers:
        size = (f"over {bound} once decoded (Content-Encoding "
                f"{_header(request, hdrs.CONTENT_ENCODING)})")
    elif length is None:
        size = f"over {bound} (sent without a Content-Length: reading stopped)"
    else:
        size = f"{length} bytes, over {bound}"
    return _Refused(413, RejectedInput(RejectReason.LIMITS, f"body is {size}"))


async def _read_body(request: web.BaseRequest, limit: int, take: Callable[[int], None]) -> bytes:
    """The body, without a byte-order mark opening it (as the file mode drops one opening a
    file), or _Refused once it is over `limit` bytes: the rest is never read. Each part is
    `take`n as it arrives."""
    allowed = limit + len(BOM)
    if request.content_length is not None and request.content_length > allowed:
        raise _oversized(request, limit, read=False)
    parts: list[bytes] = []
    size = 0
    try:
        async for part in request.content.iter_chunked(64 * 1024):
            size += len(part)
            if size > allowed:
                raise _oversized(request, limit, read=True)
            take(len(part))
            parts.append(part)
    except (web.RequestPayloadError, HttpProcessingError) as error:
        raise _Refused(400, RejectedInput(
            RejectReason.JSON, f"the body cannot be read: its chunked or Content-Encoding "
            f"framing is broken ({type(error).__name__})")) from None
    except ConnectionResetError:
        raise _Refused(400, RejectedInput(
            RejectReason.JSON, "the connection closed before the body was complete")) from None
    raw = b"".join(parts).removeprefix(BOM)
    if len(raw) > limit:
        raise _oversized(request, limit, read=True)
    return raw


class Endpoint:
    """The routes; `close` stops the engine thread."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._openapi = OPENAPI
        self._waiting = 0  # requests whose body has arrived, waiting for or at the engine
        room = service.settings.max_pending * (service.limits.max_event_bytes + len(BOM))
        self._bodies = _BodyBytes(room, service.body_bytes)

    def _handle(self, raw: bytes) -> tuple[Assembly | RejectedInput, bytes, int, int]:
        """In the engine thread: the outcome, the response body if assembled, and when the
        engine started and ended (ns, wall clock: for spans and the latency metric only)."""
        started = time.time_ns()
        try:
            assembly = assemble_bytes(raw, self.service.registry, self.service.limits)
        except RejectedInput as rejected:
            return rejected, b"", started, time.time_ns()
        return assembly, body(assembly), started, time.time_ns()

    def _rejected(self, rejected: RejectedInput, status: int, seconds: float,
                  trace: str | None) -> web.Response:
        self.service.metrics.observe(None, rejected, seconds, dead_lettered=False)
        log.warning("rejected request: %s", _cut(rejected.message, MESSAGE_CHARS),
                    extra={"request_id": rejected.request_id, "reason": rejected.reason,
                           "traceparent": trace})
        return _rejection(rejected, status)

    def _busy(self) -> web.Response:
        self.service.busy.inc()
        log.warning("busy: %d requests pending, %d bytes of bodies held", self._waiting,
                    self._bodies.held)
        return web.json_response(
            {"message": f"busy: {self._waiting} requests pending; retry shortly"},
            status=503, headers={"Retry-After": "1"},
        )

    def _engine_full(self) -> None:
        if self._waiting >= self.service.settings.max_pending:
            raise _Busy

    async def assemble(self, request: web.Request) -> web.Response:
        tracing = self.service.tracing
        span = (tracing.begin_request(request.method, ASSEMBLE_PATH, request.headers,
                                      time.time_ns()) if tracing.enabled else None)
        trace = valid_traceparent(request.headers.get("traceparent", ""))
        with self._bodies.holding() as take:
            outcome, response = await self._respond(request, trace, take)
            if trace is not None:
                response.headers["traceparent"] = trace
            await self._send(request, response)
        if span is not None:
            if outcome is not None:
                result, _, started, ended = outcome
                tracing.child(span, "assemble", started).end(ended)
                assembly = result if isinstance(result, Assembly) else None
                rejected = result if isinstance(result, RejectedInput) else None
                tracing.assembled(span, assembly, rejected)
            tracing.responded(span, response.status)
            span.end()
        return response

    async def _respond(
        self, request: web.Request, trace: str | None, take: Callable[[int], None]
    ) -> tuple[tuple[Assembly | RejectedInput, bytes, int, int] | None, web.Response]:
        """The engine's outcome (None: refused before the engine) and the response."""
        service = self.service
        try:
            self._engine_full()  # refused unread while the engine is that far behind
            _refuse_non_json(request)
            with service.pending.labels("reading").track_inprogress():
                async with asyncio.timeout(service.settings.body_timeout_seconds):
                    raw = await _read_body(request, service.limits.max_event_bytes, take)
            self._engine_full()
        except _Busy:
            return None, self._busy()
        except _Refused as refused:
            return None, self._rejected(refused.rejected, refused.status, 0.0, trace)
        except TimeoutError:
            return None, self._too_slow(trace)
        outcome = await self._engine(raw)
        result, data, started, ended = outcome
        seconds = (ended - started) / 1e9
        if isinstance(result, RejectedInput):
            status = _STATUS.get(result.reason, 422)
            return outcome, self._rejected(result, status, seconds, trace)
        self.service.metrics.observe(result, None, seconds)
        log.debug("assembled", extra={"request_id": result.prompt.request_id,
                                      "traceparent": trace})
        return outcome, web.Response(body=data, content_type=JSON)

    async def _engine(self, raw: bytes) -> tuple[Assembly | RejectedInput, bytes, int, int]:
        self._waiting += 1
        try:
            with self.service.pending.labels("engine").track_inprogress():
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._executor, self._handle, raw)
        finally:
            self._waiting -= 1

    async def _send(self, request: web.Request, response: web.Response) -> None:
        """Write the response while the request's bytes are still held, within body_timeout:
        a client that reads it slower is cut off, so answers nobody reads cannot pile up."""
        try:
            async with asyncio.timeout(self.service.settings.body_timeout_seconds):
                await response.prepare(request)
                await response.write_eof()
        except TimeoutError:
            self.service.slow_clients.inc()
            log.warning("slow client: response not read within %g s; connection closed",
                        self.service.settings.body_timeout_seconds)
            if request.transport is not None:
                request.transport.abort()

    def _too_slow(self, trace: str | None) -> web.Response:
        """408: counted as a slow client, apart from rejected events and back-pressure."""
        seconds = self.service.settings.body_timeout_seconds
        self.service.slow_clients.inc()
        log.warning("slow client: body not complete %g s after its head", seconds,
                    extra={"traceparent": trace})
        rejected = RejectedInput(
            RejectReason.LIMITS, f"the body did not arrive within {seconds:g} s of the request's "
            "head (body timeout)")
        response = _rejection(rejected, 408)
        response.force_close()
        return response

    def _check(self, raw: bytes) -> RejectedInput | bytes:
        """In the engine thread: the CitationCheck's bytes, or why there are none."""
        limits = self.service.limits
        try:
            asked = citations.decode_request(raw, limits)
            return encode(citations.check(asked.answer, asked.prompt, limits))
        except RejectedInput as rejected:
            return rejected

    async def check_citations(self, request: web.Request) -> web.Response:
        """The citation check, read and bounded as an event is (its body may hold a prompt
        and an answer, each event-sized), in the engine's thread."""
        trace = valid_traceparent(request.headers.get("traceparent", ""))
        limit = citations.request_bytes(self.service.limits)
        with self._bodies.holding() as take:
            try:
                self._engine_full()
                _refuse_non_json(request)
                async with asyncio.timeout(self.service.settings.body_timeout_seconds):
                    raw = await _read_body(request, limit, take)
                self._engine_full()
                response = await self._checked(raw, trace)
            except _Busy:
                response = self._busy()
            except _Refused as refused:
                response = self._refused(refused.rejected, refused.status, trace)
            except TimeoutError:
                response = self._too_slow(trace)
            if trace is not None:
                response.headers["traceparent"] = trace
            await self._send(request, response)
        return response

    async def _checked(self, raw: bytes, trace: str | None) -> web.Response:
        self._waiting += 1
        try:
            with self.service.pending.labels("engine").track_inprogress():
                loop = asyncio.get_running_loop()
                outcome = await loop.run_in_executor(self._executor, self._check, raw)
        finally:
            self._waiting -= 1
        if isinstance(outcome, RejectedInput):
            return self._refused(outcome, _STATUS.get(outcome.reason, 422), trace)
        return web.Response(body=outcome, content_type=JSON)

    def _refused(self, rejected: RejectedInput, status: int, trace: str | None) -> web.Response:
        """A citation check refused: logged, not counted as a rejected event."""
        log.warning("citation check refused: %s", _cut(rejected.message, MESSAGE_CHARS),
                    extra={"request_id": rejected.request_id, "reason": rejected.reason,
                           "traceparent": trace})
        return _rejection(rejected, status)

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.service.metrics.exposition(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readiness(self, _: web.Request) -> web.Response:
        ready = self.service.ready
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def openapi(self, _: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type=JSON)

    async def expect_continue(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: a body announced over max_event_bytes is answered 413 at
        once, never invited with `100 Continue` first; any other is aiohttp's to continue."""
        limit = self.service.limits.max_event_bytes
        if request.content_length is not None and request.content_length > limit + len(BOM):
            refused = _oversized(request, limit, read=False)
            trace = valid_traceparent(request.headers.get("traceparent", ""))
            response = self._rejected(refused.rejected, refused.status, 0.0, trace)
            response.force_close()  # the body the client may send regardless is not read
            return response
        await _default_expect_handler(request)
        return None

    def close(self) -> None:
        self._executor.shutdown(wait=True)


@web.middleware
async def json_routing_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's answers to an unknown path (404) and a method a path does not take (405) in
    the API's JSON, as the busy answer: `{"message": ...}`, the field every error body has."""
    try:
        return await _routed(request, handler)
    finally:  # answered: the next bytes on the connection start the next request
        if isinstance(request.protocol, _Connection):
            request.protocol.message_start = None


async def _routed(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        paths = sorted(resource.canonical for resource in request.app.router.resources())
        message = f"no such path {_cut(request.path, QUOTED_CHARS)!r}; paths: {', '.join(paths)}"
        return web.json_response({"message": message}, status=404)
    except web.HTTPMethodNotAllowed as error:
        allowed = sorted(error.allowed_methods)
        message = (f"{_cut(request.method, QUOTED_CHARS)} is not allowed on {request.path}; "
                   f"allowed: {', '.join(allowed)}")
        return web.json_response({"message": message}, status=405,
                                 headers={hdrs.ALLOW: ",".join(allowed)})


def build_app(service: Service) -> web.Application:
    """The application; its engine thread stops on cleanup."""
    endpoint = Endpoint(service)
    app = web.Application(middlewares=[json_routing_errors])
    app.router.add_post(ASSEMBLE_PATH, endpoint.assemble, expect_handler=endpoint.expect_continue)
    app.router.add_post(CITATIONS_PATH, endpoint.check_citations,
                        expect_handler=endpoint.expect_continue)
    app.router.add_get("/metrics", endpoint.metrics)
    app.router.add_get("/health", endpoint.health)
    app.router.add_get("/ready", endpoint.readiness)
    app.router.add_get("/openapi.json", endpoint.openapi)

    async def stop_engine(_: web.Application) -> None:
        service.ready = False
        endpoint.close()

    app.on_cleanup.append(stop_engine)
    return app


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, answering a request it cannot parse (and an
    unexpected error) in the rejection shape, without quoting the request; to a HEAD, as
    every answer to a HEAD, without a body."""

    message_start: bytes | None = None  # the first bytes of the request being received

    def data_received(self, data: bytes) -> None:
        if self.message_start is None:
            self.message_start = data.lstrip(b"\r\n")[:5]
        super().data_received(data)

    def handle_error(self, request: web.BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: a response is half sent, so the
            raise ConnectionError("a response was already started")  # connection is broken
        what = type(exc).__name__ if exc is not None else "unknown"
        if status >= 500:
            log.error("unexpected error answering a request", exc_info=exc)
            rejected = RejectedInput(RejectReason.ENGINE, f"unexpected error ({what}); it is "
                                     "in the server's log")
        else:
            log.debug("not a valid HTTP request (%s)", what)
            rejected = RejectedInput(RejectReason.JSON, f"not a valid HTTP/1.1 request ({what})")
        # Data aiohttp cannot parse reaches here as method UNKNOWN, answered once for the
        # first request in it: its first bytes say whether that was a HEAD, whose answer
        # has no body (a proxy would take one for the next answer on the connection).
        unparsed = request.method == _UNPARSED
        if request.method == hdrs.METH_HEAD or (unparsed and self.message_start == b"HEAD "):
            response = web.Response(status=status, content_type=JSON)
        else:
            response = _rejection(rejected, status)
        response.force_close()
        return response


class Server:
    """The endpoint on host:port (port 0: any free port, then `port` says which)."""

    def __init__(self, service: Service, host: str, port: int) -> None:
        self._runner = web.AppRunner(build_app(service))
        self._idle_timeout = service.settings.idle_timeout_seconds
        self._host = host
        self._port = port
        self._listener: asyncio.Server | None = None
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        manager = self._runner.server
        assert manager is not None
        loop = asyncio.get_running_loop()

        def connection() -> _Connection:
            return _Connection(manager, loop=loop, keepalive_timeout=self._idle_timeout,
                               access_log=cast(Logger, None))  # None: no access log

        self._listener = await loop.create_server(connection, self._host, self._port)
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()  # no new connections; the runner ends the open ones
        await self._runner.cleanup()
