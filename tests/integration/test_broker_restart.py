"""The broker goes away mid-stream and comes back: the worker recovers by itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.kafka import Broker, running_broker
from harness.worker import (
    StartWorker,
    Topics,
    events,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker of this module's own: restarting the session's would disturb other tests."""
    with running_broker(tmp_path_factory.mktemp("kafka-restart")) as broker:
        yield broker


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_worker_recovers_from_a_broker_restart(
    own_broker: Broker, tmp_path: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(own_broker)
    lines = events(200)
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"},
                            broker=own_broker)
    await produce(own_broker, topics.input, keyed(lines[:100]))
    await wait_for(lambda: worker.metric(
        'context_assembler_events_total{outcome="assembled"}') >= 20)
    own_broker.restart()
    await produce(own_broker, topics.input, keyed(lines[100:]))
    committed = guarantee == "exactly_once"
    prompts = await read_topic(own_broker, topics.prompts, until=200, timeout=240,
                               committed_only=committed, settle=3)
    ids = [json.loads(r.value)["request_id"] for r in prompts]
    assert set(ids) == {json.loads(line)["request_id"] for line in lines}, worker.log_tail()
    if committed:
        assert len(ids) == 200, f"{len(ids) - 200} duplicates under exactly_once"
    assert worker.alive()
    worker.wait_ready(timeout=60)
