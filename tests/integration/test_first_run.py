"""A new user's first run, on a real broker: topics, produce, the worker, and the docs.

The documentation's blocks on the development broker (the worker quick start, the debugging
walkthroughs) are run here as a reader pastes them (tests/support/doc_blocks.py), on a broker
of their own started by `make broker-start`, so the pages stay true.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from context_assembler.contract.catalogue import LONG_RETENTION_MS, OUTPUT_RETENTION_MS
from context_assembler.settings import Settings
from harness.kafka import Broker
from harness.worker import StartWorker, Topics, WorkerProcess
from tests.support.doc_blocks import (
    BlockRun,
    block_id,
    broker_session,
    fresh_shell_env,
    problems,
    run_block,
    runnable_blocks,
)
from tests.test_docs import CHECKED

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[2]
CREATE = "create it with `context-assembler topics create`"
EXAMPLE_IDS = [json.loads(line)["request_id"]
               for line in (REPO / "examples" / "events.jsonl").read_text().splitlines()]


def cli(broker: Broker, topics: Topics, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASSEMBLER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
           "ASSEMBLER_INPUT_TOPIC": topics.input, "ASSEMBLER_PROMPTS_TOPIC": topics.prompts,
           "ASSEMBLER_AUDIT_TOPIC": topics.audit, "ASSEMBLER_DLQ_TOPIC": topics.dlq,
           "ASSEMBLER_POLICIES_TOPIC": topics.policies}
    return subprocess.run([sys.executable, "-m", "context_assembler.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


async def described(broker: Broker, names: list[str]) -> dict[str, tuple[int, dict[str, str]]]:
    """name -> (partitions, configs) as the broker has them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        partitions = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
    finally:
        await admin.close()
    configs = {
        resource["resource_name"]: {e["config_names"]: e["config_value"]
                                    for e in resource["config_entries"]}
        for response in responses for resource in response.to_object()["resources"]
    }
    return {name: (partitions[name], configs[name]) for name in names}


async def test_topics_create_is_idempotent_and_reports_what_differs(broker: Broker) -> None:
    topics = Topics.fresh()
    names = [topics.input, topics.prompts, topics.audit, topics.dlq, topics.policies]

    first = cli(broker, topics, "topics", "create", "--partitions", "2")
    assert (first.returncode, first.stderr) == (0, "")
    assert first.stdout.splitlines() == [f"created  {name}" for name in names]
    found = await described(broker, names)
    for name in names:
        partitions, configs = found[name]
        assert partitions == 2
        assert configs["max.message.bytes"] == str(Settings().max_message_bytes)
        long_kept = name in (topics.audit, topics.dlq, topics.policies)
        assert configs["retention.ms"] == str(LONG_RETENTION_MS if long_kept
                                              else OUTPUT_RETENTION_MS)
        assert configs["cleanup.policy"] == ("compact" if name == topics.policies else "delete")

    again = cli(broker, topics, "topics", "create", "--partitions", "2")
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout.splitlines() == [f"exists   {name}" for name in names]

    other = cli(broker, topics, "topics", "create", "--partitions", "3")
    assert other.returncode == 1
    assert other.stdout.splitlines() == [f"differs  {name}: partitions 2 (wanted 3)"
                                         for name in names]
    assert (await described(broker, names))[topics.input][0] == 2, "left as it was"


async def test_a_topic_with_other_configs_is_reported(broker: Broker) -> None:
    topics = Topics.fresh()
    await broker.create_topics({topics.dlq: 6}, configs={"max.message.bytes": "100000"})
    result = cli(broker, topics, "topics", "create")
    assert result.returncode == 1
    assert (f"differs  {topics.dlq}: max.message.bytes 100000 (wanted 1048576); "
            f"retention.ms 604800000 (wanted {LONG_RETENTION_MS})") in result.stdout.splitlines()
    assert f"created  {topics.input}" in result.stdout.splitlines()


def test_produce_to_a_missing_topic_is_one_line(broker: Broker) -> None:
    topics = Topics.fresh()
    result = cli(broker, topics, "produce", "examples/events.jsonl")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"context-assembler: topic {topics.input} does not exist; {CREATE}\n"


def test_a_worker_without_its_topics_says_why_it_is_not_ready(
    broker: Broker, logs: Path, running_worker: StartWorker
) -> None:
    """One clear log line and /ready's reason; JSON logs without terminal escape codes; the
    temp dir faust insists on is gone after SIGTERM."""
    topics = Topics.fresh()
    temp = logs / "tmp"
    temp.mkdir()
    worker = running_worker(topics, env={"TMPDIR": str(temp)}, ready=False)
    try:
        # First it records its policies, and says so while their topic is missing.
        status, body = ready_reason(worker, starting="not consuming yet: cannot record the "
                                    "policies: topic")  # after a first try: "publishing"
        assert status == 503, worker.log_tail()
        assert body["reason"] == ("not consuming yet: cannot record the policies: topic "
                                  f"{topics.policies} does not exist; {CREATE}")
        asyncio.run(broker.create_topics({topics.policies: 1}, compacted=True))
        # Until its first look at the topics it says it is joining the group, which is true.
        status, body = ready_reason(worker, starting="missing topics")
        assert status == 503, worker.log_tail()
        assert body["reason"] == (f"missing topics: {topics.input}, {topics.prompts}, "
                                  f"{topics.audit}, {topics.dlq}; create them with "
                                  "`context-assembler topics create`")
        assert faust_dirs(temp), "the worker's temp dir is where this test looks"
        time.sleep(6)  # another check of the topics: logged once all the same
    finally:
        assert worker.stop() == 0, worker.log_tail()
    output = worker.log_path.read_bytes()
    assert b"\x1b" not in output
    entries = [json.loads(line) for line in output.splitlines()]  # every line is JSON
    about_input = [e for e in entries
                   if e["logger"] == "context_assembler.kafka.tools.topics" and e.get("topic") == topics.input]
    assert [e["message"] for e in about_input] == [
        f"topic {topics.input} does not exist; {CREATE}"]
    assert faust_dirs(temp) == []


def ready_reason(worker: WorkerProcess, starting: str) -> tuple[int, dict[str, object]]:
    """/ready's status and body once it gives a reason (one `starting` so)."""
    deadline = time.monotonic() + 60
    status, body = 0, {}
    while time.monotonic() < deadline:
        assert worker.alive(), worker.log_tail()
        try:
            status, raw = worker.get("/ready")
            body = json.loads(raw)
        except OSError:  # not listening yet, or between two servers
            status, body = 0, {}
        if str(body.get("reason", "")).startswith(starting):
            break
        time.sleep(0.2)
    return status, body


def faust_dirs(temp: Path) -> list[Path]:
    return list(temp.glob("context-assembler-faust-*"))


def test_the_docs_blocks_on_the_broker_run_pasted_alone_as_shown(tmp_path: Path) -> None:
    """The worker quick start, then every block that uses its broker (the debugging
    walkthroughs, the re-drive), then the one that stops it: each alone in a fresh bash, on a
    broker of its own started by `make broker-start` as a new user would, each command exiting
    and printing as its page says; the worker's lines are few, none above INFO, and it leaves
    no temp dir behind."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    kafka_dir = tmp_path / "kafka"
    env = fresh_shell_env({"KAFKA_DIR": str(kafka_dir), "TMPDIR": str(temp),
                           "ASSEMBLER_HTTP_PORT": str(free_port())})  # 8080 may be taken
    session = broker_session(runnable_blocks(CHECKED))
    assert [block.document for block in session][:1] == ["docs/worker.md"]
    assert "docs/debugging.md" in {block.document for block in session}
    runs: list[BlockRun] = []
    try:
        for block in session:
            runs.append(run_block(block, env, timeout=600))
            found = problems(runs[-1])
            assert not found, f"{block_id(block)}:\n" + "\n\n".join(found)
    finally:
        subprocess.run([sys.executable, "-m", "harness", "broker", "stop", str(kafka_dir)], cwd=REPO,
                       capture_output=True, timeout=120, check=False)
    output = "".join(run.output for run in runs)
    assert "\x1b" not in output, "no terminal escape codes"
    assert faust_dirs(temp) == []
    lines = output.splitlines()
    tailed = [line for line in runs[0].output.splitlines()
              if " from retrieval.results/" in line and "cites" in line]
    assert sorted(line.split()[0] for line in tailed) == sorted(EXAMPLE_IDS)
    logged = [json.loads(line) for line in lines if line.startswith('{"time"')]
    first_run = logged[:[e["message"] for e in logged].index("stopped") + 1]
    (summary,) = [e for e in first_run if e["logger"] == "context_assembler.observability.summary"]
    assert summary["message"].startswith("assembled 8 events: 8 prompts (")
    assert first_run[0]["message"].startswith("starting on 127.0.0.1:")
    assert {e["level"] for e in first_run} == {"INFO"}, output
    assert len(first_run) <= 8, output
    assert [e["message"] for e in logged if e["level"] != "INFO"] == [
        "rejected input: policy 'window-8k' is not allowed here; allowed: default"], output


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
