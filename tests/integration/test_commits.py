"""At-least-once commits on a real broker: a kill -9 never finds a commit past an event
whose outputs were not published. (A stop and a rebalance redo nothing:
test_delivery_conformance.py, for both guarantees.)"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.structs import ConsumerRecord

from harness.kafka import Broker
from harness.worker import (
    StartWorker,
    Topics,
    committed_offsets,
    events,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
# Events a kill must land among: enough that it lands mid-stream however fast the
# worker gets (with batching it did 400 before the kill in one CI run).
STREAM = 2000
ASSEMBLED = 'context_assembler_events_total{outcome="assembled"}'


def request_ids(records: list[ConsumerRecord]) -> Counter[str]:
    return Counter(json.loads(r.value)["request_id"] for r in records)


def sources(records: list[ConsumerRecord]) -> set[tuple[int, int]]:
    """The input (partition, offset) each output answers, from its headers."""
    found = set()
    for record in records:
        headers = dict(record.headers)
        found.add((int(headers["context-assembler.source.partition"]),
                   int(headers["context-assembler.source.offset"])))
    return found


async def test_sigkill_never_commits_past_an_undelivered_event(
    broker: Broker, logs: Path, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(STREAM)
    first = running_worker(topics, log="first")
    await produce(broker, topics.input, keyed(lines))
    await wait_for(lambda: first.metric(ASSEMBLED) >= 60)
    for _ in range(100):  # kill once a commit has landed, so there is something to check
        if sum((await committed_offsets(broker, topics.group, topics.input)).values()):
            break
        await asyncio.sleep(0.05)
    first.kill()  # no goodbye, no final commit
    committed = await committed_offsets(broker, topics.group, topics.input)
    prompts = await read_topic(broker, topics.prompts, until=0, timeout=3)
    audits = await read_topic(broker, topics.audit, until=0, timeout=3)
    assert len(prompts) < STREAM, "the kill came too late to test anything"
    assert sum(committed.values()) > 0, "nothing committed before the kill"
    below = {(p, o) for p, end in committed.items() for o in range(end)}
    assert below <= sources(prompts), "committed past an event without its prompt"
    assert below <= sources(audits), "committed past an event without its audit"
    running_worker(topics, log="second")
    prompts = await read_topic(broker, topics.prompts, until=STREAM, settle=3)
    assert set(request_ids(prompts)) == {json.loads(line)["request_id"] for line in lines}
