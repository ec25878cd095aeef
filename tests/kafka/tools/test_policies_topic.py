"""The worker records its policies before it consumes: a missing topic is logged once and
waited for, never skipped.

Against a real broker: tests/integration/test_recorded_policy.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import load_preset
from context_assembler.intake.recorded_policies import record_bytes
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import SkippedBatch
from context_assembler.kafka.tools import policies_topic as module
from context_assembler.kafka.tools.policies_topic import publish_at_start, read_policies
from context_assembler.kafka.tools.topics import missing_topic
from context_assembler.settings import Settings
from tests.kafka.tools.replay.fakes import FakeReader, Topics

SETTINGS = Settings(policies_topic="pol", retry_backoff_max_seconds=0.05)
POLICIES = [Policy(), load_preset("window-8k")]


def test_a_missing_topic_is_logged_once_and_waited_for(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    checks: list[str] = []
    published: list[list[str]] = []

    async def check(clients: KafkaClients, topic: str) -> None:
        checks.append(topic)
        if len(checks) < 4:
            raise missing_topic(topic)

    async def publish(clients: KafkaClients, topic: str, policies: Sequence[Policy],
                      schema_id: int | None) -> None:
        published.append([p.hash for p in policies])

    monkeypatch.setattr(module, "check_topic", check)
    monkeypatch.setattr(module, "publish", publish)
    with caplog.at_level(logging.INFO, logger=module.__name__):
        assert asyncio.run(publish_at_start(SETTINGS, POLICIES, asyncio.Event()))
    assert checks == ["pol"] * 4
    assert published == [[p.hash for p in POLICIES]]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["cannot record the policies, so not consuming yet: topic pol does not "
                      "exist; create it with `context-assembler topics create`"]


def test_stopping_while_waiting_publishes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    async def check(clients: KafkaClients, topic: str) -> None:
        raise missing_topic(topic)

    async def run() -> bool:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        return await publish_at_start(SETTINGS, POLICIES, stop)

    monkeypatch.setattr(module, "check_topic", check)
    assert asyncio.run(run()) is False


def test_the_topic_is_read_whole_compaction_gaps_and_all() -> None:
    topics = Topics()
    topics.first[("pol", 0)] = 5  # the first records were compacted away
    for policy in POLICIES:
        topics.append("pol", 0, record_bytes(policy), key=policy.hash.encode())
    recorded = asyncio.run(read_policies(FakeReader(topics), "pol"))
    assert [recorded.policy(p.hash) for p in POLICIES] == POLICIES


def test_a_record_batch_skipped_unread_is_logged_and_the_records_after_it_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topics = Topics()
    topics.append("pol", 0, SkippedBatch(first_offset=0, last_offset=0, codec="zstd",
                                         compressed_bytes=9000, limit=1 << 25, declared=None))
    for policy in POLICIES:
        topics.append("pol", 0, record_bytes(policy), key=policy.hash.encode())
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        recorded = asyncio.run(read_policies(FakeReader(topics), "pol"))
    assert [recorded.policy(p.hash) for p in POLICIES] == POLICIES
    assert len(recorded) == len(POLICIES)
    (line,) = caplog.messages
    assert line.startswith("pol/0: record batch at offset 0 (zstd, 9000 bytes compressed)")
