"""Replay, compare and explain against what a real worker published on a real broker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from context_assembler.cli.main import main
from harness.kafka import Broker
from harness.worker import (
    ALLOWED_POLICIES,
    Topics,
    events,
    keyed,
    produce,
    read_topic,
    started_workers,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


@dataclass
class Published:
    topics: Topics
    first: list[bytes]
    second: list[bytes]
    between_ms: int  # a time after the first batch and before the second
    prompts: dict[str, bytes]
    audits: dict[str, bytes]


async def committed_offsets(broker: Broker, group: str) -> dict[tuple[str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}


@pytest.fixture(scope="module")
def published(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Published]:
    """Two batches through the real worker, a second apart; then the worker stops."""
    topics = Topics.fresh()
    lines = events(24)
    first, second = lines[:12], lines[12:]

    async def publish() -> Published:
        await topics.create(broker)
        with started_workers(lambda: broker, tmp_path_factory.mktemp("w")) as start:
            worker = start(topics)
            await produce(broker, topics.input, keyed(first))
            await read_topic(broker, topics.audit, until=12, timeout=60)
            await asyncio.sleep(1.0)
            between = int(time.time() * 1000)
            await asyncio.sleep(1.0)
            await produce(broker, topics.input, keyed(second))
            prompts = await read_topic(broker, topics.prompts, until=24, settle=1)
            audits = await read_topic(broker, topics.audit, until=24, settle=1)
            assert worker.stop() == 0
        return Published(topics, first, second, between,
                         {r.key.decode(): r.value for r in prompts},
                         {r.key.decode(): r.value for r in audits})

    yield asyncio.run(publish())


def replay(published: Published, broker: Broker, *args: str) -> int:
    t = published.topics
    allowed = [arg for name in ALLOWED_POLICIES for arg in ("--allow-policy", name)]
    return main(["replay", "--bootstrap-servers", broker.bootstrap_servers,
                 "--input-topic", t.input, "--prompts-topic", t.prompts,
                 "--audit-topic", t.audit, *allowed, *args])


def jsonl(path: Path) -> dict[str, bytes]:
    return {json.loads(line)["request_id"]: line for line in path.read_bytes().splitlines()}


def test_replaying_the_published_range_is_byte_identical(
    published: Published, broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = asyncio.run(committed_offsets(broker, published.topics.group))
    out, audit = tmp_path / "prompts.jsonl", tmp_path / "audit.jsonl"
    status = replay(published, broker, "--compare", "--out", str(out), "--audit", str(audit))
    captured = capsys.readouterr()
    report = captured.out
    assert status == 0, captured.err + report
    assert "replayed 24 events (0 rejected): 24 identical, 0 different, 0 not published" in report
    assert jsonl(out) == published.prompts and jsonl(audit) == published.audits
    # The replay read without a group: the worker's committed offsets are untouched.
    assert asyncio.run(committed_offsets(broker, published.topics.group)) == before
    assert sum(before.values()) == 24


def test_a_changed_policy_names_the_chunks_that_changed_and_why(
    published: Published, broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tight = tmp_path / "tight.toml"
    tight.write_text("[budget]\ncontext_tokens = 300\n")
    status = replay(published, broker, "--compare", "--policy", str(tight),
                    "--from", "0:0", "--from", "1:0", "--from", "2:0")
    report = capsys.readouterr().out
    assert status == 1
    assert "different" in report and "policy: default sha256:" in report and "-> tight" in report
    # q30-staff: the warranty table no longer fits under 300 tokens
    assert "chunk wp-2-periods (rank 2): kept as [wp-2-periods] -> dropped: over_budget" in report
    assert "prompt text:" in report and "--- published" in report


def test_replay_by_time_takes_only_what_came_after(
    published: Published, broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from datetime import UTC, datetime

    when = datetime.fromtimestamp(published.between_ms / 1000, UTC).isoformat()
    out = tmp_path / "later.jsonl"
    assert replay(published, broker, "--from-time", when, "--out", str(out), "--compare") == 0
    assert set(jsonl(out)) == {json.loads(line)["request_id"] for line in published.second}
    assert "replayed 12 events" in capsys.readouterr().out


def test_replay_into_a_topic_and_count(
    published: Published, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    target = f"{published.topics.group}.replayed"
    asyncio.run(broker.create_topics({target: 1, f"{target}.audit": 1}))
    assert replay(published, broker, "--count", "5", "--to-topic", target) == 0
    records = asyncio.run(read_topic(broker, target, until=5, committed_only=True, settle=1))
    assert len(records) == 5
    assert {r.value for r in records} <= set(published.prompts.values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--input-topic", "no-such-topic"], "does not exist"),
        (["--from", "0:100000"], "past the end"),
        (["--from", "9:0"], "has no partition 9"),
        (["--from", "zero"], "PARTITION:OFFSET"),
        (["--from-time", "yesterday"], "ISO-8601"),
    ],
)
def test_bad_ranges_are_clear_errors_and_write_nothing(
    published: Published, broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    args: list[str], message: str,
) -> None:
    out = tmp_path / "out.jsonl"
    assert replay(published, broker, "--out", str(out), *args) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no file, no partial file


def test_explain_finds_the_audit_and_its_input(
    published: Published, broker: Broker, capsys: pytest.CaptureFixture[str]
) -> None:
    request_id = json.loads(published.first[1])["request_id"]  # a q30-customer copy
    args = ["explain", request_id, "--kafka", "--bootstrap-servers", broker.bootstrap_servers,
            "--audit-topic", published.topics.audit]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert f"input {published.topics.input}/" in table
    assert "dropped: access_denied" in table and "kept as [wp-2-periods]" in table
    assert main([*args[:1], "nobody", *args[2:]]) == 2
    assert "no audit for request 'nobody'" in capsys.readouterr().err
