import json
import logging
import urllib.error
import urllib.request

import pytest

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import HandlerContext, Origin, handle
from context_assembler.observability.http import HealthServer, ListenError
from context_assembler.observability.logs import JsonFormatter
from context_assembler.observability.metrics import Metrics
from context_assembler.observability.summary import AssemblySummary
from context_assembler.settings import Settings
from tests.factories import EXAMPLES


def observe(metrics: Metrics, raw: bytes, seconds: float) -> None:
    context = HandlerContext(settings=Settings(prompts_topic="p", audit_topic="a",
                                               dlq_topic="d", group_id="w"),
                             registry=PolicyRegistry(Policy()))
    outcome = handle(raw, Origin("in", 0, 0, None, (), None), context)
    metrics.observe(outcome.assembly, outcome.rejected, seconds)


def sample(metrics: Metrics, name: str, labels: dict[str, str] | None = None) -> float:
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_metrics_count_events_drops_tokens_and_dead_letters() -> None:
    metrics = Metrics()
    good = (EXAMPLES / "events.jsonl").read_bytes().splitlines()[1]  # q30-customer
    observe(metrics, good, 0.002)
    observe(metrics, b"{bad", 0.0001)
    assert sample(metrics, "context_assembler_events_total", {"outcome": "assembled"}) == 1
    assert sample(metrics, "context_assembler_events_total", {"outcome": "rejected"}) == 1
    assert sample(metrics, "context_assembler_chunks_total", {"decision": "access_denied"}) == 1
    assert sample(metrics, "context_assembler_chunks_total", {"decision": "kept"}) == 3
    assert sample(metrics, "context_assembler_dlq_records_total", {"reason": "json"}) == 1
    assert sample(metrics, "context_assembler_tokens_total", {"part": "context"}) > 0
    assert sample(metrics, "context_assembler_assembly_duration_seconds_count") == 2


async def test_http_endpoints() -> None:
    import asyncio

    metrics = Metrics()
    ready = {"now": False}
    server = HealthServer(metrics.exposition, lambda: ready["now"], "127.0.0.1", 0)
    await server.start()

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}") as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    try:
        assert (await asyncio.to_thread(get, "/health"))[0] == 200
        assert (await asyncio.to_thread(get, "/ready"))[0] == 503
        ready["now"] = True
        assert (await asyncio.to_thread(get, "/ready"))[0] == 200
        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and b"context_assembler_events_total" in body
    finally:
        await server.stop()


def test_log_lines_are_json_with_the_extra_fields() -> None:
    record = logging.LogRecord("w", logging.WARNING, __file__, 1, "rejected %s", ("x",), None)
    record.request_id = "r1"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "rejected x" and entry["request_id"] == "r1"
    assert entry["level"] == "WARNING"


async def test_a_port_in_use_names_the_setting_to_change() -> None:
    first = HealthServer(Metrics().exposition, lambda: True, "127.0.0.1", 0)
    await first.start()
    try:
        assert first.port is not None
        second = HealthServer(Metrics().exposition, lambda: True, "127.0.0.1", first.port)
        with pytest.raises(ListenError) as raised:
            await second.start()
    finally:
        await first.stop()
    assert str(raised.value) == (
        f"127.0.0.1:{first.port} (ASSEMBLER_HTTP_HOST:ASSEMBLER_HTTP_PORT) is in use (another "
        "worker on this machine?); set ASSEMBLER_HTTP_PORT to a free port, or 0 for any")


def test_the_worker_listens_on_this_machine_only_by_default() -> None:
    assert Settings().http_host == "127.0.0.1"


async def test_the_summary_sums_a_burst_into_one_line_and_the_rest_at_the_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    summary = AssemblySummary(interval=60.0, gather=0.05)
    with caplog.at_level(logging.INFO, logger="context_assembler.observability.summary"):
        for tokens in (100, 200, 300):
            summary.assembled(tokens)
        summary.rejected("policy")
        await asyncio.sleep(0.2)  # the burst's line, a moment after it arrived
        summary.assembled(50)
        await asyncio.sleep(0.2)  # within the interval: no line yet
        lines = [r.getMessage() for r in caplog.records]
        summary.flush()  # on stopping
        summary.flush()  # nothing left: no line
    assert lines == ["assembled 4 events: 3 prompts (600 prompt tokens), 1 dead letter (policy 1)"]
    assert [r.getMessage() for r in caplog.records] == [
        *lines, "assembled 1 event: 1 prompt (50 prompt tokens), 0 dead letters"]


def test_a_fresh_brokers_coordinator_lines_are_debug_and_other_client_errors_stay(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from context_assembler.observability import logs

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    touched = [logging.getLogger(name) for name in ("aiokafka", "faust", "mode", *logs.DEMOTED)]
    saved = [(logger.level, logger.filters[:]) for logger in touched]
    try:
        logs.configure("INFO")
        coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
        coordinator.error("Group Coordinator Request failed: %s",
                          "[Error 15] GroupCoordinatorNotAvailableError")
        coordinator.warning("Marking the coordinator dead (node %s)for group %s.", 1, "g")
        logging.getLogger("aiokafka").error('Unable connect to "%s:%s": %s', "127.0.0.1", 9, "x")
        logging.getLogger("aiokafka").error("Unable connect to node with id %s: %s", 1, "x")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for logger, (was, filters) in zip(touched, saved, strict=True):
            logger.setLevel(was)
            logger.filters[:] = filters
    (line,) = capsys.readouterr().err.splitlines()
    assert json.loads(line)["message"] == "Unable connect to node with id 1: x"
