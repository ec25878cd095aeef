"""`context-assembler worker`: wire settings, policy, metrics and one delivery path."""

from __future__ import annotations

import asyncio
import logging
import signal

from worker.kafka.pipeline import EventPipeline
from worker.kafka.records import Handler, handle
from worker.observability import logs
from worker.observability.http import HealthServer
from worker.observability.metrics import Metrics
from worker.policies import PolicyRegistry, load_policy
from worker.settings import Settings

log = logging.getLogger("context_assembler.worker")


def run_worker(settings: Settings, handler: Handler = handle) -> int:
    logs.configure(settings.log_level)
    policy = load_policy(settings.policy_file)  # a bad policy stops the worker before it joins
    metrics = Metrics()
    pipeline = EventPipeline(settings, PolicyRegistry(policy), metrics, handler)
    log.info(
        "starting", extra={"policy": policy.name, "policy_hash": policy.hash,
                           "guarantee": settings.processing_guarantee,
                           "input_topic": settings.input_topic, "group_id": settings.group_id},
    )
    if settings.processing_guarantee == "exactly_once":
        asyncio.run(_run_transactional(settings, pipeline, metrics))
        return 0
    _run_faust(settings, pipeline, metrics)
    return 0


async def _run_transactional(settings: Settings, pipeline: EventPipeline, metrics: Metrics) -> None:
    from worker.kafka.transactional import TransactionalWorker

    worker = TransactionalWorker(settings, pipeline)
    server = HealthServer(metrics, worker.ready, settings.http_host, settings.http_port)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await server.start()
    log.info("http listening", extra={"port": server.port})
    try:
        await worker.run()
    finally:
        await server.stop()
        pipeline.close()


def _run_faust(settings: Settings, pipeline: EventPipeline, metrics: Metrics) -> None:
    import faust

    from worker.kafka.faust_app import build_app

    app = build_app(settings, pipeline)

    def assigned() -> int:
        try:
            return len(app.consumer.assignment())
        except Exception:  # not started yet, or stopping
            return 0

    def ready() -> bool:
        return assigned() > 0

    metrics.assigned.set_function(assigned)

    server = HealthServer(metrics, ready, settings.http_host, settings.http_port)

    @app.task  # type: ignore[untyped-decorator]
    async def serve_http() -> None:
        await server.start()
        log.info("http listening", extra={"port": server.port})

    worker = faust.Worker(app, loglevel=settings.log_level, override_logging=False, quiet=True)
    try:
        worker.execute_from_commandline()
    finally:
        pipeline.close()
