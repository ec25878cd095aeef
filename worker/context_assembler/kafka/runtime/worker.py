"""`context-assembler worker`: wire settings, policies, metrics and one delivery path."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import tempfile

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry, load_policy, warm_tokenizers
from context_assembler.intake.recorded_policies import registry_policies
from context_assembler.kafka.batches import guard
from context_assembler.kafka.clients import kafka_security, start_up_problem
from context_assembler.kafka.records import Handler, handle
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.schema_registry import (
    NotRegistered,
    SchemaRegistry,
    output_ids_at_start,
)
from context_assembler.kafka.tools.policies_topic import Recording, publish_at_start
from context_assembler.kafka.tools.topics import TopicWatch, topic_watch, worker_topics
from context_assembler.observability import logs
from context_assembler.observability.http import HealthServer, ListenError
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings, SettingsError, unknown_variables

log = logging.getLogger(__name__)


def run_worker(settings: Settings, handler: Handler = handle) -> int:
    logs.configure(settings.log_level)
    for warning in unknown_variables(os.environ):
        log.warning(warning)
    # A bad policy or a missing vocabulary stops the worker before it joins the group, naming
    # the setting that holds it: the service policy is loaded (and its tokenizers) first.
    try:
        service = load_policy(settings.policy_file)
        warm_tokenizers(service)
    except ContextAssemblerError as error:
        log.error("cannot start: ASSEMBLER_POLICY_FILE: %s", error)
        return 2
    try:
        registry = PolicyRegistry(service, map(load_policy, settings.allowed_policies))
    except ContextAssemblerError as error:
        log.error("cannot start: ASSEMBLER_ALLOWED_POLICIES: %s", error)
        return 2
    problem = _start_up_problem(settings)
    if problem:
        log.error("cannot start: %s", problem)
        return 2
    guard(settings.max_batch_bytes)
    try:
        schemas = SchemaRegistry(settings) if settings.schema_registry_url else None
    except SettingsError as error:
        log.error("cannot start: %s", error)
        return 2
    metrics = Metrics()
    runner = EventRunner(settings, registry, metrics, handler, schemas=schemas)
    policy = registry.default
    log.info(
        "starting on %s: %s -> %s, %s", settings.bootstrap_servers, settings.input_topic,
        settings.prompts_topic, settings.audit_topic,
        extra={"bootstrap_servers": settings.bootstrap_servers, "policy": policy.name,
               "policy_hash": policy.hash, "allowed_policies": registry.allowed_names,
               "guarantee": settings.processing_guarantee,
               "input_topic": settings.input_topic, "group_id": settings.group_id},
    )
    try:
        if not _record_policies(settings, registry_policies(registry), metrics, runner, schemas):
            return 0  # stopped while waiting for the policies topic
        if settings.processing_guarantee == "exactly_once":
            asyncio.run(_run_transactional(settings, runner, metrics))
        else:
            _run_faust(settings, runner, metrics)  # faust's worker ends with SystemExit
    except (ListenError, NotRegistered) as error:
        log.error("cannot start: %s", error)
        return 2
    finally:
        log.info("stopped")
    return 0


def _start_up_problem(settings: Settings) -> str | None:
    """Credentials, certificates or ACLs the broker refuses, checked before anything else
    talks to it (`start_up_problem`); in a loop of its own, as `_record_policies`'."""
    try:
        security = kafka_security(settings)
    except SettingsError as error:
        return str(error)
    topics = [spec.name for spec in worker_topics(settings, 1, 1)]
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(
            start_up_problem(settings.bootstrap_servers, security, topics, settings.group_id))
    finally:
        loop.close()


def _record_policies(settings: Settings, policies: list[Policy], metrics: Metrics,
                     runner: EventRunner, schemas: SchemaRegistry | None) -> bool:
    """With a schema registry, look the output schemas' ids up (the runner frames its
    outputs with them); then publish the policies before either worker consumes. SIGTERM
    or SIGINT while waiting for the registry or the topic stops the worker (False).
    Meanwhile /health answers and /ready says what it waits for. A loop of its own, never
    made the current one: faust gets the same fresh event loop it gets without this step."""
    recording = Recording()
    server = HealthServer(metrics.exposition, lambda: False, settings.http_host,
                          settings.http_port, recording.reason)

    async def record(stop: asyncio.Event) -> bool:
        await server.start()
        try:
            policy_schema_id = None
            if schemas is not None:
                problems: list[str] = []
                recording.problems = problems
                ids = await output_ids_at_start(schemas, stop, problems)
                await schemas.close()
                if ids is None:
                    return False
                runner.frame_outputs(ids)
                policy_schema_id = ids.policy
                log.info("framing outputs with their registered schema ids", extra={
                    "prompt_schema_id": ids.prompt, "audit_schema_id": ids.audit,
                    "policy_schema_id": ids.policy})
            return await publish_at_start(settings, policies, stop, recording, policy_schema_id)
        finally:
            await server.stop()  # the worker's own server takes the port over

    loop = asyncio.new_event_loop()
    try:
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return loop.run_until_complete(record(stop))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        loop.close()


async def _run_transactional(settings: Settings, runner: EventRunner, metrics: Metrics) -> None:
    from context_assembler.kafka.runtime.transactional import TransactionalWorker

    worker = TransactionalWorker(settings, runner)
    watch = topic_watch(settings)

    def ready() -> bool:
        return worker.ready() and not watch.missing

    def reason() -> str | None:
        return not_ready_reason(watch, runner, len(worker.assignment.partitions))

    metrics.ready.set_function(lambda: float(ready()))
    server = HealthServer(metrics.exposition, ready, settings.http_host, settings.http_port,
                          reason)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    await server.start()
    log.info("http listening on %s:%s (/metrics, /health, /ready)", settings.http_host,
             server.port, extra={"host": settings.http_host, "port": server.port})
    watching = asyncio.create_task(watch.run())
    try:
        await worker.run()
    finally:
        watching.cancel()
        await server.stop()
        runner.close()


def _run_faust(settings: Settings, runner: EventRunner, metrics: Metrics) -> None:
    from context_assembler.kafka.runtime.faust_app import FaustWorker, build_app

    datadir = tempfile.TemporaryDirectory(prefix="context-assembler-faust-")
    app = build_app(settings, runner, datadir.name)
    watch = topic_watch(settings)

    def assigned() -> int:
        try:
            return len(app.consumer.assignment())
        except Exception:  # not started yet, or stopping
            return 0

    def reason() -> str | None:
        return not_ready_reason(watch, runner, assigned())

    def ready() -> bool:
        return reason() is None

    metrics.assigned.set_function(assigned)
    metrics.ready.set_function(lambda: float(ready()))
    runner.watch_lag(lambda partition: app.consumer.highwater(partition))  # made on start

    server = HealthServer(metrics.exposition, ready, settings.http_host, settings.http_port,
                          reason)

    @app.task  # type: ignore[untyped-decorator]
    async def serve_http() -> None:
        await server.start()
        log.info("http listening on %s:%s (/metrics, /health, /ready)", settings.http_host,
                 server.port, extra={"host": settings.http_host, "port": server.port})

    @app.task  # type: ignore[untyped-decorator]
    async def watch_topics() -> None:
        await watch.run()

    worker = FaustWorker(app, settings.log_level)
    worker.spinner = None  # it writes terminal escape codes to stdout, even when not a tty
    try:
        worker.execute_from_commandline()
    finally:
        runner.close()
        datadir.cleanup()


def not_ready_reason(watch: TopicWatch, runner: EventRunner, assigned: int) -> str | None:
    """Why /ready answers 503, what the operator must fix first; None when ready."""
    return watch.reason() or runner.blocked or (
        None if assigned else "no partitions assigned: joining the group, or more workers "
        "than input partitions")
