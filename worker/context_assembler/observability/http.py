"""GET /metrics (Prometheus text), /health (the loop answers) and /ready (can work)."""

from __future__ import annotations

import errno
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from context_assembler.engine.errors import ContextAssemblerError


class ListenError(ContextAssemblerError, OSError):
    """The worker's HTTP address cannot be bound: named as the operator sets it."""


class HealthServer:
    """`exposition`: the /metrics page (Metrics.exposition); `ready`: what /ready answers;
    `reason`: why it is not ready, if known (in the 503's body, for the operator)."""

    def __init__(
        self, exposition: Callable[[], bytes], ready: Callable[[], bool], host: str, port: int,
        reason: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._exposition = exposition
        self._ready = ready
        self._reason = reason
        self._host = host
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def _metrics_page(self, _: web.Request) -> web.Response:
        body = self._exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _readiness(self, _: web.Request) -> web.Response:
        if self._ready():
            return web.json_response({"ready": True})
        reason = self._reason()
        body = {"ready": False, **({"reason": reason} if reason else {})}
        return web.json_response(body, status=503)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics_page)
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._readiness)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as error:
            await self._runner.cleanup()
            problem = ("is in use (another worker on this machine?)"
                       if error.errno == errno.EADDRINUSE else f"cannot be bound: {error.strerror}")
            raise ListenError(
                f"{self._host}:{self._port} (ASSEMBLER_HTTP_HOST:ASSEMBLER_HTTP_PORT) {problem}; "
                "set ASSEMBLER_HTTP_PORT to a free port, or 0 for any") from None
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self._port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
