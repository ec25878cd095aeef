"""The worker's topics: what `topics create` asks for, and how a missing one is reported.

Against a real broker: tests/integration/test_first_run.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import urllib.error
import urllib.request
from typing import Any, ClassVar

import pytest
from aiokafka.errors import KafkaConnectionError, UnknownTopicOrPartitionError

from context_assembler.cli.main import main
from context_assembler.kafka import clients
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.tools import topics
from context_assembler.kafka.tools.topics import TopicReport, TopicWatch, topic_watch, worker_topics
from context_assembler.observability.http import HealthServer
from context_assembler.settings import Settings

CLOSED_PORT = "127.0.0.1:9"  # discard: nothing listens there


def test_worker_topics_follow_the_settings() -> None:
    settings = Settings(input_topic="in", prompts_topic="out", audit_topic="audit",
                        dlq_topic="dlq", policies_topic="policies", max_message_bytes=2_000_000)
    specs = {spec.name: spec for spec in worker_topics(settings, 12, 3)}
    assert list(specs) == ["in", "out", "audit", "dlq", "policies"]
    for spec in specs.values():
        assert (spec.partitions, spec.replication_factor) == (12, 3)
        # The broker must accept every record the worker allows itself to send.
        assert spec.configs["max.message.bytes"] == "2000000"
        # Three replicas: an acknowledged write is on two of them, so one broker may fail.
        assert spec.configs["min.insync.replicas"] == "2"
    retention = {name: int(spec.configs["retention.ms"]) for name, spec in specs.items()}
    assert retention["audit"] == retention["dlq"] > retention["in"] == retention["out"]
    # One record per policy hash, kept for as long as outputs may name it.
    compacted = [name for name, spec in specs.items()
                 if spec.configs.get("cleanup.policy") == "compact"]
    assert compacted == ["policies"]


@pytest.mark.parametrize("replication_factor", [1, 2])
def test_fewer_than_three_replicas_keep_the_brokers_min_insync_replicas(
    replication_factor: int,
) -> None:
    for spec in worker_topics(Settings(), 6, replication_factor):
        assert "min.insync.replicas" not in spec.configs, spec.name


def test_the_asyncapi_file_describes_the_topics_topics_create_makes() -> None:
    """Its Kafka bindings state the defaults of the settings and of `topics create`."""
    from context_assembler.cli.kafka import topic_sizes
    from context_assembler.cli.main import build_parser
    from context_assembler.generate.schemas import asyncapi

    document = asyncapi()
    defaults = topic_sizes(build_parser().parse_args(["topics", "create"]))
    settings = Settings()
    (server,) = document["servers"].values()
    assert server["variables"]["bootstrapServers"]["default"] == settings.bootstrap_servers
    specs = {spec.name: spec for spec in worker_topics(settings, *defaults)}
    assert set(document["channels"]) == set(specs)
    for name, channel in document["channels"].items():
        binding = channel["bindings"]["kafka"]
        assert (binding["topic"], binding["partitions"]) == (name, specs[name].partitions)
        configs = specs[name].configs
        assert binding["topicConfiguration"] == {
            "cleanup.policy": [configs.get("cleanup.policy", "delete")],
            "retention.ms": int(configs["retention.ms"]),
            "max.message.bytes": int(configs["max.message.bytes"]),
        }, name
    (consume,) = (op for op in document["operations"].values() if op["action"] == "receive")
    assert consume["channel"]["$ref"] == f"#/channels/{settings.input_topic}"
    assert consume["bindings"]["kafka"]["groupId"]["default"] == settings.group_id


def test_the_watch_covers_every_worker_topic() -> None:
    settings = Settings()
    assert topic_watch(settings).topics == [s.name for s in worker_topics(settings, 1, 1)]


def test_a_report_names_what_differs() -> None:
    assert TopicReport("in", "created").render() == "created  in"
    assert (TopicReport("in", "differs", ("partitions 3 (wanted 6)", "retention.ms 1 (wanted 2)"))
            .render() == "differs  in: partitions 3 (wanted 6); retention.ms 1 (wanted 2)")


class FakeAdmin:
    """describe_topics answers from `existing`, which the test changes as it goes."""

    existing: ClassVar[set[str]] = set()

    def __init__(self, **_: Any) -> None:
        pass

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        return [{"topic": name, "partitions": [],
                 "error_code": 0 if name in self.existing else UnknownTopicOrPartitionError.errno}
                for name in names]


async def until(predicate: Any) -> None:
    async with asyncio.timeout(5):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_a_missing_topic_is_logged_once_and_is_the_ready_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(clients, "AIOKafkaAdminClient", FakeAdmin)
    monkeypatch.setattr(FakeAdmin, "existing", {"out"})
    watch = TopicWatch(KafkaClients("broker:9092"), ["in", "out"], interval=0.01)
    server = HealthServer(lambda: b"", lambda: not watch.missing, "127.0.0.1", 0, watch.reason)
    await server.start()
    caplog.set_level(logging.INFO, logger="context_assembler.kafka.tools.topics")
    watching = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.missing == ("in",))
        await asyncio.sleep(0.1)  # several more checks
        status, body = await asyncio.to_thread(get, server.port, "/ready")
        assert status == 503
        assert body == {"ready": False, "reason": "missing topics: in; create them with "
                                                  "`context-assembler topics create`"}
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert errors == ["topic in does not exist; create it with "
                          "`context-assembler topics create`"]

        FakeAdmin.existing = {"in", "out"}
        await until(lambda: not watch.missing)
        assert watch.reason() is None
        assert await asyncio.to_thread(get, server.port, "/ready") == (200, {"ready": True})
        assert "every topic exists now" in caplog.text
    finally:
        watching.cancel()
        await server.stop()


async def test_a_refused_connection_at_run_time_is_logged_once_and_is_the_ready_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refusal = "SASL authentication failed at broker:9092 (SASL_SSL SCRAM-SHA-512 as svc)"
    problems: list[str | None] = [refusal]

    class RefusingAdmin(FakeAdmin):
        async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
            if problems[0]:
                raise KafkaConnectionError("Unable to bootstrap")
            return await super().describe_topics(names)

    async def diagnose(servers: str, security: object) -> str | None:
        return problems[0]

    monkeypatch.setattr(clients, "AIOKafkaAdminClient", RefusingAdmin)
    monkeypatch.setattr(topics, "connection_problem", diagnose)
    monkeypatch.setattr(FakeAdmin, "existing", {"in"})
    watch = TopicWatch(KafkaClients("broker:9092"), ["in"], interval=0.01)
    caplog.set_level(logging.INFO, logger="context_assembler.kafka.tools.topics")
    watching = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.refused == refusal)
        await asyncio.sleep(0.1)  # several more checks
        assert watch.reason() == f"the broker refuses the connection: {refusal}"
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert errors == [f"the broker refuses the connection: {refusal}"]
        problems[0] = None
        await until(lambda: watch.refused is None)
        assert watch.reason() is None
        assert "the broker accepts the connection again" in caplog.text
    finally:
        watching.cancel()


def get(port: int | None, path: str) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.parametrize("argv", [
    ["topics", "create", "--bootstrap-servers", CLOSED_PORT],
    ["produce", "--bootstrap-servers", CLOSED_PORT, "examples/events.jsonl"],
])
def test_an_unreachable_broker_is_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"context-assembler: cannot reach the Kafka broker at {CLOSED_PORT} "
                   "(bootstrap servers: --bootstrap-servers or ASSEMBLER_BOOTSTRAP_SERVERS)\n")


@pytest.mark.parametrize(("argv", "sizes"), [
    (["topics", "create"], (6, 1)),
    (["topics", "create", "--partitions", "3", "--replication-factor", "2"], (3, 2)),
    # Before the subcommand too: its parser's defaults must not overwrite them.
    (["topics", "--partitions", "3", "--replication-factor", "2", "create"], (3, 2)),
    (["topics", "--partitions", "4", "--format", "strimzi"], (4, 1)),
])
def test_topics_take_partitions_and_replication_factor(argv: list[str],
                                                        sizes: tuple[int, int]) -> None:
    from context_assembler.cli.kafka import topic_sizes
    from context_assembler.cli.main import build_parser

    assert topic_sizes(build_parser().parse_args(argv)) == sizes
    with pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--partitions", "0"])


def test_topics_prints_the_kafka_topics_commands_of_what_create_makes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["topics", "--bootstrap-servers", "kafka:9093", "--partitions", "3",
                 "--replication-factor", "3", "--policies-topic", "my.policies"]) == 0
    lines = capsys.readouterr().out.splitlines()
    specs = worker_topics(Settings(policies_topic="my.policies"), 3, 3)
    assert len(lines) == len(specs)
    for line, spec in zip(lines, specs, strict=True):
        words = shlex.split(line)
        assert words[:8] == ["kafka-topics", "--bootstrap-server", "kafka:9093",
                             "--command-config", "admin.properties", "--create", "--topic",
                             spec.name]
        assert words[8:12] == ["--partitions", "3", "--replication-factor", "3"]
        configs = dict(word.split("=", 1) for word in words[13::2])
        assert words[12::2] == ["--config"] * len(spec.configs) and configs == spec.configs


def test_ready_gives_first_the_reason_an_operator_must_fix() -> None:
    from types import SimpleNamespace

    from context_assembler.kafka.runtime.worker import not_ready_reason

    watch = TopicWatch(KafkaClients("broker:9092"), ["in"])
    stuck = SimpleNamespace(blocked="prompts: TopicAuthorizationFailedError")
    flowing = SimpleNamespace(blocked=None)
    # Before the broker has described the topics once, a topic may be missing: not ready.
    assert not_ready_reason(watch, flowing, 3) == "checking that the worker's topics exist"  # type: ignore[arg-type]
    watch.checked = True
    assert not_ready_reason(watch, flowing, 3) is None  # type: ignore[arg-type]
    assert not_ready_reason(watch, flowing, 0).startswith("no partitions assigned")  # type: ignore[arg-type, union-attr]
    assert not_ready_reason(watch, stuck, 3) == stuck.blocked  # type: ignore[arg-type]
    watch.missing = ("in",)
    assert not_ready_reason(watch, stuck, 0) == watch.reason()  # type: ignore[arg-type]
