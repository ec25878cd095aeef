"""A zombie under exactly_once: a worker paused past the session timeout with work in flight,
its partitions given to another worker, then resumed, must not publish that work.

aiokafka commits a transaction's offsets without the group's generation (no KIP-447), so the
group cannot stop the zombie; the per-partition transactional ids do (the new owner's producer
fences the zombie's). Whatever the exact timing of the pause, read_committed readers must see
every request answered exactly once; the zombie's log says when it was fenced. (The fence
itself, deterministically: tests/kafka/runtime/test_transactional.py.)
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

from harness.kafka import Broker
from harness.worker import (
    StartWorker,
    Topics,
    WorkerProcess,
    events,
    file_mode,
    keyed,
    produce,
    read_topic,
    wait_for,
)

EVENTS = 3000
PARTITIONS = 4
SESSION_TIMEOUT = 6.0  # the least the worker accepts: the pause outlasts it


async def test_a_resumed_zombie_is_fenced_and_every_request_is_answered_once(
    broker: Broker, logs: Path, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    await topics.create(broker, partitions=PARTITIONS)
    lines = events(EVENTS)
    env = {"ASSEMBLER_SESSION_TIMEOUT_SECONDS": str(SESSION_TIMEOUT)}
    zombie = running_worker(topics, "exactly_once", log="zombie", env=env)
    assert zombie.process is not None
    try:
        await produce(broker, topics.input, keyed(lines))
        # Paused mid-backlog: a batch is being assembled or committed, never all of them.
        await wait_for(lambda: zombie.metric("context_assembler_events_total") >= EVENTS // 10)
        os.kill(zombie.process.pid, signal.SIGSTOP)
        log_before_pause = zombie.log_path.read_text()
        # The heir's join waits for the zombie's session to expire, then takes every partition:
        # the zombie is out of the group, and does not know it.
        heir = running_worker(topics, "exactly_once", log="heir", env=env, ready=False)
        await wait_for(lambda: heir.alive() and _metric(heir, "assigned_partitions") == PARTITIONS,
                       timeout=90)
        os.kill(zombie.process.pid, signal.SIGCONT)
        # The zombie's in-flight transaction is fenced; it rejoins and shares the work again.
        prompts = await read_topic(broker, topics.prompts, until=EVENTS, committed_only=True,
                                   timeout=240, settle=3.0)
        audits = await read_topic(broker, topics.audit, until=EVENTS, committed_only=True,
                                  timeout=60, settle=1.0)
        assert zombie.alive(), f"the zombie exited; log:\n{zombie.log_tail()}"
    finally:
        if zombie.alive():  # a paused worker cannot stop: resumed first (the heir: the fixture)
            os.kill(zombie.process.pid, signal.SIGCONT)
            zombie.stop()

    expected_prompts, expected_audits = file_mode(lines)
    zombie_log = zombie.log_path.read_text()[len(log_before_pause):]
    fenced = zombie_log.count("was fenced")
    for name, records, expected in (("prompts", prompts, expected_prompts),
                                    ("audits", audits, expected_audits)):
        ids = Counter(json.loads(r.value)["request_id"] for r in records)
        twice = sorted(i for i, n in ids.items() if n > 1)
        missing = sorted(set(expected) - set(ids))
        assert not twice, (
            f"{len(twice)} requests have more than one of their {name} for read_committed "
            f"readers (e.g. {twice[:3]}); the zombie was fenced {fenced} times")
        assert not missing, f"{len(missing)} requests have no {name} (e.g. {missing[:3]})"
        differ = [r.key for r in records if expected[json.loads(r.value)["request_id"]] != r.value]
        assert not differ, f"{len(differ)} {name} differ from the file mode's"


def _metric(worker: WorkerProcess, name: str) -> float:
    try:
        return worker.metric(f"context_assembler_{name}")
    except OSError:  # not listening yet
        return -1.0
