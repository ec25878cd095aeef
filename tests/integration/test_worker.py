"""The worker on a real broker: its answers are file mode's, byte for byte. How it delivers
them (dead letters, stops, crashes, scale-out) is test_delivery_conformance.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.kafka import Broker
from harness.worker import (
    StartWorker,
    Topics,
    events,
    file_mode,
    keyed,
    produce,
    read_topic,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_every_event_gives_one_prompt_and_one_audit_equal_to_file_mode(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(48)
    worker = running_worker(topics, guarantee)
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
    transactions = worker.metric("context_assembler_transactions_total")
    assert 1 <= transactions <= 48 if committed else transactions == 0
