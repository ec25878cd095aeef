"""Why exactly-once does not use faust: this test shows faust's own guarantee failing.

faust-streaming 0.15.3 with processing_guarantee="exactly_once", killed with SIGKILL
mid-stream and restarted, publishes records that a read_committed reader sees twice
(faust-streaming #517; in the first run 205 duplicates for 2,000 inputs). The worker's
exactly_once path is therefore built on aiokafka's transactional producer
(worker/context_assembler/kafka/runtime/transactional.py), and test_delivery_conformance.py's
SIGKILL test holds it to zero duplicates. If this test starts failing, faust may have fixed the bug: reconsider.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness.kafka import Broker
from harness.worker import Topics, produce, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
APP = Path(__file__).resolve().parents[1] / "support" / "faust_eos_app.py"


def start(broker: Broker, topics: Topics, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FAUST_EOS_BROKER": broker.bootstrap_servers,
           "FAUST_EOS_IN": topics.input, "FAUST_EOS_OUT": topics.prompts,
           "FAUST_EOS_GROUP": topics.group}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, str(APP)], env=env, stdout=out, stderr=out)


async def test_faust_exactly_once_publishes_duplicates_after_a_crash(
    broker: Broker, tmp_path: Path
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    count = 2000
    await produce(broker, topics.input,
                  ((f"k{i}".encode(), f"v{i}".encode(), []) for i in range(count)))
    first = start(broker, topics, tmp_path / "first.log")
    try:
        await read_topic(broker, topics.prompts, until=count // 4, timeout=120)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    second = start(broker, topics, tmp_path / "second.log")
    try:
        committed = await read_topic(broker, topics.prompts, until=count, committed_only=True,
                                     timeout=180, settle=5)
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.to_thread(second.wait, 60)
    values = [record.value for record in committed]
    assert set(values) == {f"v{i}".encode() for i in range(count)}  # nothing lost ...
    assert len(values) > count, "no duplicates: faust's exactly_once may work now"  # ... but twice
