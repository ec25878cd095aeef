"""`context-assembler worker`: wire settings, policies, metrics and one delivery path."""

from __future__ import annotations

import asyncio
import logging
import signal

from worker.engine.errors import ContextAssemblerError
from worker.intake.policies import build_registry
from worker.kafka.observability import logs
from worker.kafka.observability.http import HealthServer
from worker.kafka.observability.metrics import Metrics
from worker.kafka.records import Handler, handle
from worker.kafka.runner import EventRunner
from worker.kafka.settings import Settings

log = logging.getLogger(__name__)


def run_worker(settings: Settings, handler: Handler = handle) -> int:
    logs.configure(settings.log_level)
    try:  # a bad policy or a missing vocabulary stops the worker before it joins the group
        registry = build_registry(settings.policy_file, settings.allowed_policies)
    except ContextAssemblerError as error:
        log.error("cannot start: %s", error)
        return 2
    metrics = Metrics()
    runner = EventRunner(settings, registry, metrics, handler)
    policy = registry.default
    log.info(
        "starting", extra={"policy": policy.name, "policy_hash": policy.hash,
                           "allowed_policies": registry.allowed_names,
                           "guarantee": settings.processing_guarantee,
                           "input_topic": settings.input_topic, "group_id": settings.group_id},
    )
    if settings.processing_guarantee == "exactly_once":
        asyncio.run(_run_transactional(settings, runner, metrics))
        return 0
    _run_faust(settings, runner, metrics)
    return 0


async def _run_transactional(settings: Settings, runner: EventRunner, metrics: Metrics) -> None:
    from worker.kafka.transactional import TransactionalWorker

    worker = TransactionalWorker(settings, runner)
    server = HealthServer(metrics.exposition, worker.ready, settings.http_host, settings.http_port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await server.start()
    log.info("http listening", extra={"port": server.port})
    try:
        await worker.run()
    finally:
        await server.stop()
        runner.close()


def _run_faust(settings: Settings, runner: EventRunner, metrics: Metrics) -> None:
    from worker.kafka.faust_app import FaustWorker, build_app

    app = build_app(settings, runner)

    def assigned() -> int:
        try:
            return len(app.consumer.assignment())
        except Exception:  # not started yet, or stopping
            return 0

    def ready() -> bool:
        return assigned() > 0 and not runner.blocked

    metrics.assigned.set_function(assigned)

    server = HealthServer(metrics.exposition, ready, settings.http_host, settings.http_port)

    @app.task  # type: ignore[untyped-decorator]
    async def serve_http() -> None:
        await server.start()
        log.info("http listening", extra={"port": server.port})

    worker = FaustWorker(app, runner, settings.log_level)
    try:
        worker.execute_from_commandline()
    finally:
        runner.close()
