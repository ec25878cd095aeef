"""`POST /v1/assemble`: one RetrievalResult in, `{prompt, audit}` out, the file mode's bytes.

The same intake as every other shell (limits, the policy allow-list, the same rejections),
the engine in one thread off the event loop as in the worker, the worker's metrics, and a
SERVER span per request (with an "assemble" child) continuing the caller's traceparent when
tracing is on. A body announced over max_event_bytes is refused unread, and reading stops
one chunk past it, so an oversized body is never held in memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from schemas.generate import openapi
from schemas.models import RejectReason
from worker.engine import Assembly
from worker.intake.codec import Limits, RejectedInput, encode
from worker.intake.handle import assemble_bytes
from worker.intake.policies import PolicyRegistry
from worker.kafka.observability.metrics import Metrics
from worker.kafka.observability.tracing import Tracing

log = logging.getLogger(__name__)

ASSEMBLE_PATH: Final = "/v1/assemble"
JSON: Final = "application/json"
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_STATUS: Final = {
    RejectReason.JSON: 400,
    RejectReason.ENGINE: 500,  # a bug, not the client's
}


@dataclass
class Service:
    """What the endpoint needs: the operator's policies and limits, and where to count."""

    registry: PolicyRegistry
    limits: Limits
    metrics: Metrics = field(default_factory=Metrics)
    tracing: Tracing = field(default_factory=Tracing)  # off unless given a provider
    ready: bool = True
    # Requests being read or waiting for the one engine thread: each may hold up to
    # max_event_bytes, so more are refused (503) rather than queued without bound.
    max_pending: int = 64

    def __post_init__(self) -> None:
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)


def body(assembly: Assembly) -> bytes:
    """The prompt and the audit, each exactly as the file mode encodes it."""
    return b'{"prompt":' + encode(assembly.prompt) + b',"audit":' + encode(assembly.audit) + b"}"


def _rejection(rejected: RejectedInput, status: int) -> web.Response:
    payload = {"reason": rejected.reason.value, "message": rejected.message,
               "request_id": rejected.request_id}
    return web.json_response(payload, status=status)


def _oversized(length: int | None, limits: Limits) -> RejectedInput:
    size = f"is {length} bytes" if length is not None else "is longer than that"
    return RejectedInput(
        RejectReason.LIMITS, f"body {size}, over max_event_bytes={limits.max_event_bytes}"
    )


async def _read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The body, or None once it is over `limit` bytes (the rest is never read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    parts: list[bytes] = []
    size = 0
    async for part in request.content.iter_chunked(64 * 1024):
        size += len(part)
        if size > limit:
            return None
        parts.append(part)
    return b"".join(parts)


class Endpoint:
    """The routes; `close` stops the engine thread."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._openapi = json.dumps(openapi(), sort_keys=True).encode()
        self._pending = 0

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
        log.warning("rejected request: %s", rejected.message,
                    extra={"request_id": rejected.request_id, "reason": rejected.reason,
                           "traceparent": trace})
        return _rejection(rejected, status)

    async def assemble(self, request: web.Request) -> web.Response:
        if self._pending >= self.service.max_pending:
            log.warning("busy: %d requests pending", self._pending)
            return web.json_response(
                {"message": f"busy: {self._pending} requests pending; retry shortly"},
                status=503, headers={"Retry-After": "1"},
            )
        self._pending += 1
        try:
            return await self._assemble(request)
        finally:
            self._pending -= 1

    async def _assemble(self, request: web.Request) -> web.Response:
        tracing = self.service.tracing
        span = (tracing.begin_request(request.method, ASSEMBLE_PATH, request.headers,
                                      time.time_ns()) if tracing.enabled else None)
        given = request.headers.get("traceparent", "")
        trace = given if _TRACEPARENT.fullmatch(given) else None  # never echo a forged one
        outcome, response = await self._respond(request, trace)
        if trace is not None:
            response.headers["traceparent"] = trace
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
        self, request: web.Request, trace: str | None
    ) -> tuple[tuple[Assembly | RejectedInput, bytes, int, int] | None, web.Response]:
        """The engine's outcome (None: the body was refused unread) and the response."""
        limits = self.service.limits
        raw = await _read_bounded(request, limits.max_event_bytes)
        if raw is None:
            return None, self._rejected(_oversized(request.content_length, limits), 413, 0.0,
                                        trace)
        loop = asyncio.get_running_loop()
        outcome = await loop.run_in_executor(self._executor, self._handle, raw)
        result, data, started, ended = outcome
        seconds = (ended - started) / 1e9
        if isinstance(result, RejectedInput):
            status = _STATUS.get(result.reason, 422)
            return outcome, self._rejected(result, status, seconds, trace)
        self.service.metrics.observe(result, None, seconds)
        log.debug("assembled", extra={"request_id": result.prompt.request_id,
                                      "traceparent": trace})
        return outcome, web.Response(body=data, content_type=JSON)

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

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def build_app(service: Service) -> web.Application:
    """The application; its engine thread stops on cleanup."""
    endpoint = Endpoint(service)
    app = web.Application()
    app.router.add_post(ASSEMBLE_PATH, endpoint.assemble)
    app.router.add_get("/metrics", endpoint.metrics)
    app.router.add_get("/health", endpoint.health)
    app.router.add_get("/ready", endpoint.readiness)
    app.router.add_get("/openapi.json", endpoint.openapi)

    async def stop_engine(_: web.Application) -> None:
        service.ready = False
        endpoint.close()

    app.on_cleanup.append(stop_engine)
    return app


class Server:
    """The endpoint on host:port (port 0: any free port, then `port` says which)."""

    def __init__(self, service: Service, host: str, port: int) -> None:
        self._runner = web.AppRunner(build_app(service), access_log=None)
        self._host = host
        self._port = port
        self.port: int | None = None

    async def start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, self._host, self._port).start()
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port

    async def stop(self) -> None:
        await self._runner.cleanup()
