"""The worker on a real broker: answers, dead letters, crashes, scale-out."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from tests.support.broker import Broker
from tests.support.worker import (
    Topics,
    WorkerProcess,
    events,
    file_mode,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_every_event_gives_one_prompt_and_one_audit_equal_to_file_mode(
    broker: Broker, logs: Path, guarantee: str
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(48)
    worker = WorkerProcess(broker, topics, logs / "worker.log", guarantee=guarantee).start()
    try:
        worker.wait_ready()
        await produce(broker, topics.input, keyed(lines, [("traceparent", TRACEPARENT)]))
        committed = guarantee == "exactly_once"
        prompts = await read_topic(broker, topics.prompts, until=48, committed_only=committed, settle=2)
        audits = await read_topic(broker, topics.audit, until=48, committed_only=committed, settle=2)
        expected_prompts, expected_audits = file_mode(lines)
        assert {r.key.decode(): r.value for r in prompts} == expected_prompts
        assert {r.key.decode(): r.value for r in audits} == expected_audits
        assert len(prompts) == len(audits) == 48  # no duplicates when nothing failed
        for record in prompts + audits:
            headers = dict(record.headers)
            assert headers["traceparent"] == TRACEPARENT
            assert headers["context-assembler.source.topic"] == topics.input.encode()
            assert int(headers["context-assembler.source.offset"]) >= 0
        assert worker.metric('context_assembler_events_total{outcome="assembled"}') == 48
    finally:
        worker.stop()


async def test_bad_input_goes_to_the_dead_letter_topic_and_the_stream_goes_on(
    broker: Broker, logs: Path
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
    worker = WorkerProcess(broker, topics, logs / "worker.log",
                           extra_env={"ASSEMBLER_MAX_EVENT_BYTES": "200000"}).start()
    try:
        worker.wait_ready()
        await produce(broker, topics.input, interleaved)
        dead = await read_topic(broker, topics.dlq, until=len(bad), settle=1)
        prompts = await read_topic(broker, topics.prompts, until=len(good), settle=1)
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
    finally:
        worker.stop()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_sigkill_mid_stream_loses_nothing(broker: Broker, logs: Path, guarantee: str) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    total = 2000  # enough that the kill lands mid-stream, however fast the worker is
    lines = events(total)
    worker = WorkerProcess(broker, topics, logs / "first.log", guarantee=guarantee,
                           extra_env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"}).start()
    worker.wait_ready()
    await produce(broker, topics.input, keyed(lines))
    await wait_for(lambda: worker.metric('context_assembler_events_total{outcome="assembled"}') >= 60)
    worker.kill()  # SIGKILL: no goodbye, no final commit
    killed_after = len(await read_topic(broker, topics.prompts, until=0, timeout=3))
    assert killed_after < total, "the kill came too late to test anything"
    again = WorkerProcess(broker, topics, logs / "second.log", guarantee=guarantee,
                          extra_env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"}).start()
    try:
        again.wait_ready()
        committed = guarantee == "exactly_once"
        prompts = await read_topic(broker, topics.prompts, until=total, committed_only=committed,
                                   settle=3)
        ids = [json.loads(r.value)["request_id"] for r in prompts]
        assert set(ids) == {json.loads(line)["request_id"] for line in lines}
        if committed:
            assert len(ids) == total, f"{len(ids) - total} duplicates under exactly_once"
    finally:
        again.stop()


async def test_two_workers_share_the_partitions_and_one_takes_over(
    broker: Broker, logs: Path
) -> None:
    topics = Topics.fresh()
    await topics.create(broker, partitions=6)
    first = WorkerProcess(broker, topics, logs / "a.log").start()
    second = WorkerProcess(broker, topics, logs / "b.log").start()
    try:
        first.wait_ready()
        second.wait_ready()
        await wait_for(lambda: first.metric("context_assembler_assigned_partitions")
                       + second.metric("context_assembler_assigned_partitions") == 6
                       and first.metric("context_assembler_assigned_partitions") > 0
                       and second.metric("context_assembler_assigned_partitions") > 0)
        lines = events(300)
        await produce(broker, topics.input, keyed(lines[:150]))
        await read_topic(broker, topics.prompts, until=150, timeout=60)
        assert first.metric("context_assembler_events_total") > 0
        assert second.metric("context_assembler_events_total") > 0
        assert second.stop() == 0  # leaves the group cleanly
        await produce(broker, topics.input, keyed(lines[150:]))
        prompts = await read_topic(broker, topics.prompts, until=300, settle=2)
        assert {json.loads(r.value)["request_id"] for r in prompts} == {
            json.loads(line)["request_id"] for line in lines}
        assert first.metric("context_assembler_assigned_partitions") == 6
    finally:
        first.stop()
        second.stop()
