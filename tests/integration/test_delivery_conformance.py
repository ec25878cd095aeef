"""Delivery conformance on a real broker: each test runs against both runtimes, faust
(at_least_once) and aiokafka's transactions (exactly_once), which must behave alike: outputs
in input order per partition, a bad event dead-lettered and the next one processed, a stop
mid-stream losing and redoing nothing, a worker joining or leaving with nothing lost.

Under exactly_once the outputs are read as read_committed readers see them."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiokafka.structs import ConsumerRecord

from harness.kafka import Broker
from harness.worker import (
    StartWorker,
    Topics,
    events,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600),
              pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])]
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
ASSEMBLED = 'context_assembler_events_total{outcome="assembled"}'
# Events a stop must land among: enough that it lands mid-stream however fast the worker
# gets (with batching it did 400 before the kill in one CI run).
STREAM = 2000


def request_ids(records: list[ConsumerRecord]) -> Counter[str]:
    return Counter(json.loads(r.value)["request_id"] for r in records)


def source(record: ConsumerRecord) -> tuple[int, int]:
    """The input (partition, offset) an output answers, from its headers."""
    headers = dict(record.headers)
    return (int(headers["context-assembler.source.partition"]),
            int(headers["context-assembler.source.offset"]))


async def outputs(broker: Broker, topic: str, count: int, guarantee: str,
                  settle: float = 2) -> list[ConsumerRecord]:
    return await read_topic(broker, topic, until=count, settle=settle,
                            committed_only=guarantee == "exactly_once")


async def answered_once(broker: Broker, topics: Topics, lines: list[bytes],
                        guarantee: str) -> None:
    """Every request has exactly one prompt and one audit."""
    expected = Counter(json.loads(line)["request_id"] for line in lines)
    prompts = await outputs(broker, topics.prompts, len(lines), guarantee, settle=3)
    audits = await outputs(broker, topics.audit, len(lines), guarantee, settle=1)
    assert request_ids(prompts) == expected, "prompts lost or duplicated"
    assert request_ids(audits) == expected, "audits lost or duplicated"


async def test_outputs_keep_the_input_order_of_each_partition(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(300)
    running_worker(topics, guarantee)
    await produce(broker, topics.input, keyed(lines))
    prompts = await outputs(broker, topics.prompts, len(lines), guarantee)
    # A key's outputs share a partition, read back in the order they were published.
    for partition in {record.partition for record in prompts}:
        published = [source(r) for r in prompts if r.partition == partition]
        for input_partition in {p for p, _ in published}:
            offsets = [o for p, o in published if p == input_partition]
            assert offsets == sorted(offsets), f"input partition {input_partition} reordered"
    assert sorted(source(r) for r in prompts) == sorted(set(map(source, prompts)))  # once each


async def test_bad_input_goes_to_the_dead_letter_topic_and_the_stream_goes_on(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker, partitions=1)  # one partition: a poison pill must not stall it
    good = events(6)
    huge = orjson.dumps({"request_id": "huge", "question": "q",
                         "chunks": [{"chunk_id": "a", "text": "x" * 300_000}]})
    bad: dict[str, bytes] = {
        "json": b"{not json",
        "utf8": b"\xff\xfe\x00garbage",
        "schema": b'{"request_id": "no-question"}',
        "limits": huge,
        "policy": b'{"request_id": "odd-policy", "question": "q", "policy": "nope"}',
    }
    interleaved: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = []
    for (name, raw), line in zip(bad.items(), good, strict=False):
        interleaved.append((json.loads(line)["request_id"].encode(), line, []))
        interleaved.append((name.encode(), raw, [("traceparent", TRACEPARENT)]))
    interleaved.append((b"last", good[-1], []))
    worker = running_worker(topics, guarantee, env={"ASSEMBLER_MAX_EVENT_BYTES": "200000"})
    await produce(broker, topics.input, interleaved)
    dead = await outputs(broker, topics.dlq, len(bad), guarantee, settle=1)
    prompts = await outputs(broker, topics.prompts, len(good), guarantee, settle=1)
    assert sorted(r.key.decode() for r in dead) == sorted(bad)
    for record in dead:
        headers = dict(record.headers)
        assert record.value == bad[record.key.decode()]  # the original bytes, untouched
        assert headers["__connect.errors.topic"] == topics.input.encode()
        assert int(headers["__connect.errors.offset"]) >= 0
        assert headers["__connect.errors.exception.message"]
        assert headers["traceparent"] == TRACEPARENT  # original headers are kept
    reasons = {r.key.decode(): dict(r.headers)["__connect.errors.exception.class.name"]
               for r in dead}
    assert reasons == {"json": b"RejectedInput.json", "utf8": b"RejectedInput.json",
                       "schema": b"RejectedInput.schema", "limits": b"RejectedInput.limits",
                       "policy": b"RejectedInput.policy"}
    assert {json.loads(r.value)["request_id"] for r in prompts} == {
        json.loads(line)["request_id"] for line in good}
    assert worker.alive() and worker.get("/health")[0] == 200
    assert worker.metric("context_assembler_dlq_records_total") == len(bad)


async def test_sigterm_mid_stream_then_restart_redoes_nothing(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(STREAM)
    first = running_worker(topics, guarantee, log="first")
    try:
        await produce(broker, topics.input, keyed(lines))
        await wait_for(lambda: first.metric(ASSEMBLED) >= 60)
    finally:
        assert first.stop() == 0
    stopped_after = len(await outputs(broker, topics.prompts, 0, guarantee, settle=0))
    assert stopped_after < STREAM, "the stop came too late to test anything"
    running_worker(topics, guarantee, log="second")
    await answered_once(broker, topics, lines, guarantee)


async def test_sigkill_mid_stream_loses_nothing(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(STREAM)
    same_ids = {"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"}
    worker = running_worker(topics, guarantee, log="first", env=same_ids)
    await produce(broker, topics.input, keyed(lines))
    await wait_for(lambda: worker.metric(ASSEMBLED) >= 60)
    worker.kill()  # SIGKILL: no goodbye, no final commit
    killed_after = len(await read_topic(broker, topics.prompts, until=0, timeout=3))
    assert killed_after < STREAM, "the kill came too late to test anything"
    running_worker(topics, guarantee, log="second", env=same_ids)
    prompts = await outputs(broker, topics.prompts, STREAM, guarantee, settle=3)
    ids = request_ids(prompts)
    assert set(ids) == {json.loads(line)["request_id"] for line in lines}
    if guarantee == "exactly_once":
        assert sum(ids.values()) == STREAM, "duplicates under exactly_once"


async def test_a_worker_joining_mid_stream_redoes_nothing(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker, partitions=6)
    lines = events(400)
    first = running_worker(topics, guarantee, log="first")
    # A steady stream, 20 events every 0.5 s, so the rebalance falls in the middle of it.
    stream = asyncio.create_task(produce_slowly(broker, topics, lines, 20, 0.5))
    await wait_for(lambda: first.metric(ASSEMBLED) >= 60)
    second = running_worker(topics, guarantee, log="second", ready=False)
    await asyncio.to_thread(second.wait_ready)  # partitions assigned: rebalance over
    await stream
    await answered_once(broker, topics, lines, guarantee)
    assert second.metric(ASSEMBLED) > 0, "the rebalance came too late to test anything"


async def produce_slowly(broker: Broker, topics: Topics, lines: list[bytes], batch: int,
                         pause: float) -> None:
    for start in range(0, len(lines), batch):
        await produce(broker, topics.input, keyed(lines[start:start + batch]))
        await asyncio.sleep(pause)


async def test_a_worker_leaving_hands_its_partitions_over_with_nothing_lost(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker, partitions=6)
    first = running_worker(topics, guarantee, log="a", ready=False)
    second = running_worker(topics, guarantee, log="b", ready=False)
    try:
        first.wait_ready()
        second.wait_ready()
        await wait_for(lambda: first.metric("context_assembler_assigned_partitions")
                       + second.metric("context_assembler_assigned_partitions") == 6
                       and first.metric("context_assembler_assigned_partitions") > 0
                       and second.metric("context_assembler_assigned_partitions") > 0)
        lines = events(300)
        await produce(broker, topics.input, keyed(lines[:150]))
        await outputs(broker, topics.prompts, 150, guarantee, settle=0)
        assert first.metric("context_assembler_events_total") > 0
        assert second.metric("context_assembler_events_total") > 0
        assert second.stop() == 0  # leaves the group cleanly
        await produce(broker, topics.input, keyed(lines[150:]))
        await answered_once(broker, topics, lines, guarantee)
        assert first.metric("context_assembler_assigned_partitions") == 6
    finally:
        first.stop()
        second.stop()
