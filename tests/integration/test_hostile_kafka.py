"""Hostile sizes and failing sends on a real broker: nothing is lost, nothing stalls forever.

- A rejected event close to the 1 MB limit has a dead letter over it (the value plus the
  error headers): the worker publishes a truncated one instead of retrying forever.
- An output over a limit (the worker's max_message_bytes, or a topic's smaller
  max.message.bytes that only the broker knows) makes its event an output_too_large dead letter.
- SIGTERM stops the worker within its grace period even while every send fails.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import orjson
import pytest
from aiokafka.structs import ConsumerRecord

from harness.kafka import Broker
from harness.worker import (
    StartWorker,
    Topics,
    WorkerProcess,
    committed_offsets,
    end_offsets,
    events,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
GUARANTEES = ["at_least_once", "exactly_once"]
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
Produced = list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]]


def schema_invalid(size: int) -> bytes:
    """A JSON object of `size` bytes without a question: rejected by the schema."""
    head, tail = b'{"request_id": "huge", "padding": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def long_question(request_id: str, chars: int) -> bytes:
    """A valid event whose prompt is about 6 KB more than `chars` bytes."""
    event = json.loads(events(1)[0])
    event["request_id"] = request_id
    event["question"] = ("Which pump warranty applies to model X? " * 1000)[:chars]
    return orjson.dumps(event)


def many_chunks(request_id: str, count: int) -> bytes:
    """A valid event whose audit lists `count` chunks (about 170 bytes each)."""
    event = json.loads(events(1)[0])
    first = event["chunks"][0]
    event["request_id"] = request_id
    event["chunks"] = [dict(first, chunk_id=f"c{n}", text=f"filler {n} " * 30)
                       for n in range(count)]
    return orjson.dumps(event)


def interleave(good: list[bytes], hostile: dict[str, bytes]) -> Produced:
    """Good events with the hostile ones between them, each hostile one keyed by its name."""
    produced: Produced = []
    for n, line in enumerate(good):
        produced.append((json.loads(line)["request_id"].encode(), line, []))
        if n < len(hostile):
            name, raw = list(hostile.items())[n]
            produced.append((name.encode(), raw, [("traceparent", TRACEPARENT)]))
    return produced


def ids(records: list[ConsumerRecord]) -> set[str]:
    return {json.loads(r.value)["request_id"] for r in records}


async def assert_keeps_committing(broker: Broker, topics: Topics) -> None:
    """The group's committed offsets reach the end of the input: nothing is stuck."""
    ends = await end_offsets(broker, topics.input)
    deadline = time.monotonic() + 60
    while await committed_offsets(broker, topics.group, topics.input) != ends:
        assert time.monotonic() < deadline, "the worker stopped committing"
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_oversized_dead_letters_are_cut_and_oversized_outputs_dead_lettered(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    """Default limits; the prompts topic takes only 20,000 bytes, which only the broker knows."""
    topics = Topics.fresh()
    await broker.create_topics({topics.prompts: 3}, configs={"max.message.bytes": "20000"})
    await topics.create(broker, partitions=1)  # one input partition: nothing may stall it
    huge = schema_invalid(1_048_300)  # fits as an input; its dead letter would not
    big_prompt = long_question("big-prompt", 16_000)  # prompt ~22 KB, event ~19.5 KB
    good = events(5)
    produced = interleave(good, {"huge": huge, "big-prompt": big_prompt})
    # Uncompressed: the broker checks a batch's compressed size, and the prompt compresses.
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0",
                                 "ASSEMBLER_COMPRESSION_TYPE": "none"})
    try:
        await produce(broker, topics.input, produced)
        committed = guarantee == "exactly_once"
        dead = await read_topic(broker, topics.dlq, until=2, committed_only=committed, settle=2)
        prompts = await read_topic(broker, topics.prompts, until=len(good),
                                   committed_only=committed, settle=2)
        audits = await read_topic(broker, topics.audit, until=len(good),
                                  committed_only=committed, settle=1)
        letters = {r.key.decode(): r for r in dead}
        assert sorted(letters) == ["big-prompt", "huge"] and len(dead) == 2

        cut = letters["huge"]
        headers = dict(cut.headers)
        assert headers["context-assembler.truncated"] == b"true"
        assert headers["context-assembler.original.bytes"] == str(len(huge)).encode()
        assert headers["context-assembler.original.sha256"] == hashlib.sha256(huge).hexdigest().encode()
        assert huge.startswith(cut.value) and 1_040_000 < len(cut.value) < len(huge)
        assert headers["traceparent"] == TRACEPARENT  # the original headers are kept
        assert headers["__connect.errors.exception.class.name"] == b"RejectedInput.schema"
        assert headers["__connect.errors.offset"] == b"1"

        too_large = dict(letters["big-prompt"].headers)
        assert too_large["__connect.errors.exception.class.name"] == (
            b"RejectedInput.output_too_large")
        assert too_large["__connect.errors.stage"] == b"KAFKA_PRODUCE"
        assert "context-assembler.truncated" not in too_large
        assert letters["big-prompt"].value == big_prompt  # the original bytes, untouched

        assert ids(prompts) == {json.loads(line)["request_id"] for line in good}
        if committed:  # a transaction never holds half an event
            assert "big-prompt" not in ids(audits) and len(prompts) == len(good)
        # at_least_once: the audit of big-prompt may be out before the prompt was refused.
        await assert_keeps_committing(broker, topics)
        assert worker.alive() and worker.get("/ready")[0] == 200
    finally:
        assert worker.stop() == 0, worker.log_tail()


@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_outputs_over_max_message_bytes_go_to_the_dead_letter_topic(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker, partitions=1)
    big_prompt = long_question("big-prompt", 14_000)  # prompt ~20.7 KB, event ~17.5 KB
    big_audit = many_chunks("big-audit", 300)  # audit ~52 KB, prompt ~12 KB, event ~180 KB
    good = events(4)
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_MAX_MESSAGE_BYTES": "20000",
                                 "ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"})
    try:
        await produce(broker, topics.input,
                      interleave(good, {"big-prompt": big_prompt, "big-audit": big_audit}))
        committed = guarantee == "exactly_once"
        dead = await read_topic(broker, topics.dlq, until=2, committed_only=committed, settle=2)
        prompts = await read_topic(broker, topics.prompts, until=len(good),
                                   committed_only=committed, settle=1)
        audits = await read_topic(broker, topics.audit, until=len(good),
                                  committed_only=committed, settle=1)
        letters = {r.key.decode(): dict(r.headers) for r in dead}
        assert sorted(letters) == ["big-audit", "big-prompt"] and len(dead) == 2
        for headers in letters.values():
            assert headers["__connect.errors.exception.class.name"] == (
                b"RejectedInput.output_too_large")
        assert b"over the 20000" in letters["big-audit"]["__connect.errors.exception.message"]
        assert letters["big-audit"]["context-assembler.truncated"] == b"true"  # 180 KB event
        assert "context-assembler.truncated" not in letters["big-prompt"]
        # Sized before sending: no output of theirs went out, under either guarantee.
        expected = {json.loads(line)["request_id"] for line in good}
        assert ids(prompts) == ids(audits) == expected
        assert len(prompts) == len(audits) == len(good)
        await assert_keeps_committing(broker, topics)
        assert worker.metric('context_assembler_dlq_records_total{reason="output_too_large"}') == 2
    finally:
        assert worker.stop() == 0, worker.log_tail()


@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_sigterm_stops_the_worker_while_dead_letters_are_refused(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    """The DLQ takes no record of 200 bytes: every dead letter is refused, however cut."""
    topics = Topics.fresh()
    await broker.create_topics({topics.dlq: 1}, configs={"max.message.bytes": "200"})
    await topics.create(broker, partitions=1)
    good = events(6)
    produced = [*keyed(good[:3]), (b"bad", b'{"request_id": "bad"}', []), *keyed(good[3:])]
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"})
    try:
        await produce(broker, topics.input, produced)
        await wait_for(lambda: worker.get("/ready")[0] == 503, timeout=60)
        await wait_for(lambda: worker.metric("context_assembler_delivery_retries_total") >= 3)
        assert worker.alive()
    finally:
        started = time.monotonic()
        code = worker.stop(timeout=40)
        took = time.monotonic() - started
    print(f"{guarantee}: stopped in {took:.1f}s (exit {code}) while dead letters were refused")
    assert took < 20, worker.log_tail()
    # Nothing from the stuck event on was committed: the next owner redoes it.
    assert (await committed_offsets(broker, topics.group, topics.input)).get(0, 0) <= 3
    errors = [json.loads(line) for line in worker.log_path.read_text().splitlines()
              if line.startswith("{") and '"level": "ERROR"' in line]
    assert any(topics.dlq in e["message"] and "MessageSizeTooLargeError" in e["message"]
               for e in errors), worker.log_tail()


def assigned(worker: WorkerProcess) -> float:
    """Partitions the worker holds; 0 until its HTTP server answers."""
    try:
        return worker.metric("context_assembler_assigned_partitions")
    except OSError:
        return 0.0


@pytest.mark.parametrize("guarantee", GUARANTEES)
async def test_sigterm_stops_the_worker_while_the_prompts_topic_is_missing(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await broker.create_topics({topics.input: 1, topics.audit: 1, topics.dlq: 1})
    await broker.create_topics({topics.policies: 1}, compacted=True)
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"}, ready=False)
    try:
        # Not ready, and saying why: the prompts topic is missing. It still takes its input.
        await wait_for(lambda: assigned(worker) >= 1, timeout=90)
        # The topic check runs beside the assignment: until it has answered, /ready says so.
        await wait_for(lambda: "checking" not in worker.get("/ready")[1].decode())
        status, body = worker.get("/ready")
        assert status == 503 and topics.prompts in body.decode(), body
        await produce(broker, topics.input, keyed(events(20)))
        await wait_for(
            lambda: worker.metric('context_assembler_events_total{outcome="assembled"}') >= 1)
        await asyncio.sleep(2)  # the sends are waiting for the topic's metadata
        assert worker.alive()
    finally:
        started = time.monotonic()
        code = worker.stop(timeout=40)
        took = time.monotonic() - started
    print(f"{guarantee}: stopped in {took:.1f}s (exit {code}) with the prompts topic missing")
    assert took < 20 + 1, worker.log_tail()  # ASSEMBLER_SHUTDOWN_GRACE_SECONDS
    assert not await committed_offsets(broker, topics.group, topics.input)
