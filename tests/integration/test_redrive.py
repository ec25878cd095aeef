"""Re-drive on a real broker: a dead letter whose policy was not allowed is answered once the
policy is allowed; one that fails again carries its count and stops at the maximum."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from context_assembler.cli.main import main
from context_assembler.kafka.records import header
from context_assembler.kafka.tools.redrive import REDRIVES
from harness.kafka import Broker
from harness.worker import (
    StartWorker,
    Topics,
    end_offsets,
    events,
    keyed,
    produce,
    read_topic,
)
from tests.factories import naming_policy

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
BAD = b'{"request_id": "bad-1", "chunks": 3}'


async def redrive(broker: Broker, topics: Topics, *args: str) -> int:
    """The command, as run from a shell (its own event loop)."""
    return await asyncio.to_thread(
        main, ["redrive", "--bootstrap-servers", broker.bootstrap_servers,
               "--dlq-topic", topics.dlq, "--input-topic", topics.input, *args])


async def groups_reading(broker: Broker, topic: str) -> list[str]:
    """The consumer groups with offsets on `topic`."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        found = []
        for group, *_ in await admin.list_consumer_groups():
            offsets = await admin.list_consumer_group_offsets(group)
            if any(tp.topic == topic for tp in offsets):
                found.append(group)
        return found
    finally:
        await admin.close()


def test_a_dead_letter_is_answered_once_its_policy_is_allowed_and_a_failing_one_stops(
    broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    running_worker: StartWorker,
) -> None:
    topics = Topics.fresh()
    lines = events(8)
    lines[-1] = naming = naming_policy(lines[-1], "window-8k")  # a follow-up naming a preset
    named_id = json.loads(naming)["request_id"]

    async def scenario() -> None:
        await topics.create(broker, partitions=1)
        # First run: no policy may be named, so the follow-up request is dead-lettered.
        strict = running_worker(topics, log="strict", env={"ASSEMBLER_ALLOWED_POLICIES": ""})
        try:
            await produce(broker, topics.input, [*keyed(lines), (b"bad-1", BAD, [])])
            dead = await read_topic(broker, topics.dlq, until=2, timeout=90, settle=0.5)
        finally:
            assert strict.stop() == 0, strict.log_tail()
        assert {r.key for r in dead} == {named_id.encode(), b"bad-1"}
        inputs_before = await end_offsets(broker, topics.input)

        capsys.readouterr()
        assert await redrive(broker, topics) == 0  # a dry run
        report = capsys.readouterr().out.splitlines()
        assert "would re-drive 1  RejectedInput.policy" in report
        assert "would re-drive 1  RejectedInput.schema" in report
        assert report[-1] == (f"would re-drive 2 dead letters to {topics.input} (dry run: "
                              "--yes sends them); next run: --from 0:2")
        assert await end_offsets(broker, topics.input) == inputs_before

        # The policy is allowed now (the default WorkerProcess allows window-8k).
        worker = running_worker(topics)
        try:
            assert await redrive(broker, topics, "--yes") == 0
            prompts = await read_topic(broker, topics.prompts, until=8, timeout=90, settle=0.5)
            assert named_id.encode() in {r.key for r in prompts}
            # The bad one fails again, carrying its count; re-driven until the maximum.
            start = 2
            for count in (1, 2, 3):
                dead = await read_topic(broker, topics.dlq, until=start + 1, timeout=90)
                letter = dead[start]
                assert letter.key == b"bad-1"
                assert header(letter.headers, REDRIVES) == str(count).encode()
                start += 1
                capsys.readouterr()
                assert await redrive(broker, topics, "--yes", "--from", f"0:{start - 1}") == 0
                out = capsys.readouterr().out
                if count < 3:
                    assert "re-drove 1  RejectedInput.schema" in out
            assert "skipped: re-driven 3 times already: 1" in out
            assert f"re-drove 0 dead letters to {topics.input}" in out
            await asyncio.sleep(2)
            dead = await read_topic(broker, topics.dlq, until=5, settle=1)
            assert len(dead) == 5  # nothing more; nothing deleted
            assert await groups_reading(broker, topics.dlq) == []  # re-driving joined no group
        finally:
            assert worker.stop() == 0, worker.log_tail()

    asyncio.run(scenario())
