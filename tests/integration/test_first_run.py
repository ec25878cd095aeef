"""A new user's first run, on a real broker: topics, produce, the worker, and the docs.

The worker quick start (docs/worker.md) and the walkthroughs of docs/debugging.md are run word
for word by scripts/quickstart.sh, on a broker of its own (as `make broker-start` starts it),
so the pages stay true.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from context_assembler.kafka.topics import LONG_RETENTION_MS, OUTPUT_RETENTION_MS
from context_assembler.settings import Settings
from tests.support.broker import Broker
from tests.support.worker import Topics, WorkerProcess

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
    broker: Broker, tmp_path: Path
) -> None:
    """One clear log line and /ready's reason; JSON logs without terminal escape codes; the
    temp dir faust insists on is gone after SIGTERM."""
    topics = Topics.fresh()
    temp = tmp_path / "tmp"
    temp.mkdir()
    log_path = tmp_path / "worker.log"
    worker = WorkerProcess(broker, topics, log_path, extra_env={"TMPDIR": str(temp)}).start()
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
    output = log_path.read_bytes()
    assert b"\x1b" not in output
    entries = [json.loads(line) for line in output.splitlines()]  # every line is JSON
    about_input = [e for e in entries
                   if e["logger"] == "context_assembler.kafka.topics" and e.get("topic") == topics.input]
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


def test_the_docs_worker_quick_start_and_walkthroughs_work_word_for_word(tmp_path: Path) -> None:
    """The worker block pasted whole, then the debugging and re-drive walkthroughs, on a broker
    of its own started by `make broker-start` as a new user would: each visibly succeeds (or
    fails on purpose where the page says so), and the worker's lines are few, none above
    INFO."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ASSEMBLER_", "KAFKA_DIR", "VIRTUAL_ENV"))}
    # The venv is this one, already installed: make must not reinstall it under other tests.
    env["MAKEFLAGS"] = "-o .venv/bin/context-assembler"
    result = subprocess.run(["bash", "scripts/quickstart.sh", str(tmp_path)], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600, check=False)
    output = result.stdout
    assert result.returncode == 0, output + result.stderr
    lines = output.splitlines()
    assert "sent 8 events to retrieval.results" in lines
    assert ("answered 8 events: 8 prompts on prompts.assembled, 0 dead letters on "
            "retrieval.results.dlq") in lines
    tailed = [line for line in lines if " from retrieval.results/" in line and "cites" in line]
    assert sorted(line.split()[0] for line in tailed) == sorted(EXAMPLE_IDS)

    logged = [json.loads(line) for line in lines if line.startswith('{"time"')]
    first_run = logged[:[e["message"] for e in logged].index("stopped") + 1]
    (summary,) = [e for e in first_run if e["logger"] == "context_assembler.observability.summary"]
    assert summary["message"].startswith("assembled 8 events: 8 prompts (")
    assert (summary["prompts"], summary["dead_letters"]) == (8, {})
    assert first_run[0]["message"].startswith("starting on 127.0.0.1:")
    assert {e["level"] for e in first_run} == {"INFO"}, output
    assert len(first_run) <= 8, output
    assert "ERROR" not in output

    statuses = [line.split(": ", 2)[1:] for line in lines if line.startswith("quickstart: exit")]
    assert [(int(status.removeprefix("exit ")), what(command)) for status, command in statuses] == [
        (0, "explain"), (0, "replay"), (1, "replay"), (2, "replay"), (0, "replay"),
        (0, "sed"), (0, "worker"), (0, "produce"), (0, "tail"), (0, "kill"), (0, "redrive"),
        (0, "redrive")], output
    assert "request q30-customer | policy default" in output
    assert "replayed 8 events (0 rejected): 8 identical, 0 different, 0 not published" in lines
    assert "q30-customer (retrieval.results/0/0): different" in lines
    assert any(line.startswith("context-assembler: nothing to replay: no event on "
                               "retrieval.results from 2000-01-01T00:00:00.000Z") for line in lines)

    # The re-drive walkthrough: the request naming a policy not allowed is dead-lettered (the
    # second worker warns of it once), then listed and sent back.
    assert ("answered 1 events: 0 prompts on prompts.assembled, 1 dead letters on "
            "retrieval.results.dlq") in lines, output
    assert any(line.startswith("q30-customer  RejectedInput.policy: policy 'window-8k' is not "
                               "allowed here") for line in lines), output
    second_run = logged[len(first_run):]
    assert [e["message"] for e in second_run if e["level"] != "INFO"] == [
        "rejected input: policy 'window-8k' is not allowed here; allowed: default"], output
    assert second_run[-1]["message"] == "stopped"
    assert ("would re-drive 1 dead letters to retrieval.results (dry run: --yes sends them); "
            "next run: --from 0:1") in lines, output
    assert "re-drove 1 dead letters to retrieval.results; next run: --from 0:1" in lines, output


def what(command: str) -> str:
    """The command a walkthrough line runs: `context-assembler replay ...` -> replay."""
    words = command.split()
    return words[1] if words[0] == "context-assembler" else words[0]
