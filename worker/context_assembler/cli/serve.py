"""`context-assembler serve`: the HTTP endpoint until SIGINT or SIGTERM.

The server's modules (aiohttp, the worker's metrics) are imported inside the command, so
the file commands never load them.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import TYPE_CHECKING

from context_assembler.cli.common import command, note
from context_assembler.collector import collect_less
from context_assembler.intake.policy_registry import build_registry
from context_assembler.settings import Settings

if TYPE_CHECKING:
    from context_assembler.serve.app import Server


async def _serve(server: Server, host: str) -> None:
    from context_assembler.serve.app import ASSEMBLE_PATH

    await server.start()
    note(f"serving POST http://{host}:{server.port}{ASSEMBLE_PATH} (and /openapi.json, "
         "/metrics, /health, /ready); Ctrl-C stops")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()  # lets requests in flight finish, then stops the engine thread


@command
def cmd_serve(_: argparse.Namespace, settings: Settings) -> int:
    from context_assembler.observability import logs
    from context_assembler.observability.tracing import Tracing
    from context_assembler.serve.app import Server, Service

    logs.configure(settings.log_level)  # JSON lines: a rejection quotes untrusted text
    registry = build_registry(settings.policy_file, settings.allowed_policies)
    tracing = Tracing.from_environment()  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
    service = Service(registry, settings, tracing=tracing)
    server = Server(service, settings.serve_host, settings.serve_port)
    collect_less()  # started: what start-up made is never scanned again
    try:
        asyncio.run(_serve(server, settings.serve_host))
    finally:
        tracing.shutdown()  # exports the spans still buffered
    return 0
