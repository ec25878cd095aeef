"""Reading the outputs as a person would (`tail`) and waiting for answers (`produce --wait`),
over in-memory topics holding what the worker's own code publishes."""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition

from context_assembler.intake.policy_registry import build_registry
from context_assembler.kafka.records import HandlerContext, Origin, SkippedBatch, handle
from context_assembler.kafka.tools import tail as module
from context_assembler.kafka.tools.produce import key_of
from context_assembler.kafka.tools.tail import answered_input, render, tail, wait_for_answers
from context_assembler.settings import Settings
from harness.worker import events
from tests.kafka.tools.replay.fakes import FakeReader, Topics, record

T = 1_764_547_200_000
WORKER = HandlerContext(
    settings=Settings(input_topic="in", prompts_topic="p", audit_topic="a", dlq_topic="d"),
    registry=build_registry(None))
GOOD = events(3)
BAD = b'{"request_id": "bad-1", "chunks": 3}'


def published() -> Topics:
    """Inputs on "in" (partition 0: two events, partition 1: one and a bad one), and what the
    worker publishes for each on "p", "a" and "d", stamped as their inputs."""
    topics = Topics()
    for n, (partition, raw) in enumerate([(0, GOOD[0]), (1, GOOD[1]), (0, GOOD[2]), (1, BAD)]):
        topics.append("in", partition, raw, key=key_of(raw), timestamp=T + n)
        for out in handle(raw, Origin.from_record(topics.partition("in", partition)[-1]),
                          WORKER).records:
            topics.append(out.topic, partition, out.value, key=out.key, headers=out.headers,
                          timestamp=T + n)
    return topics


def tailed(topics: Topics, kind: str, topic: str, count: int) -> list[str]:
    lines: list[str] = []
    asyncio.run(tail(FakeReader(topics), kind, topic, count, False, lines.append))
    return lines


def test_tail_prints_the_last_records_oldest_first_one_line_each() -> None:
    topics = published()
    ids = [line.split()[0] for line in tailed(topics, "prompts", "p", 2)]
    assert ids == ["q30-customer-0001", "returns-no-date-0002"]  # by time, across partitions
    (prompt,) = tailed(topics, "prompts", "p", 1)
    assert prompt.startswith("returns-no-date-0002  prompt ")
    assert " policy default  cites [" in prompt and prompt.endswith("  from in/0/1")
    (audit,) = tailed(topics, "audit", "a", 1)
    assert audit.startswith("returns-no-date-0002  kept ") and audit.endswith("  from in/0/1")
    (letter,) = tailed(topics, "dlq", "d", 5)
    assert letter.startswith("bad-1  RejectedInput.schema: ") and letter.endswith(" from in/1/1")
    assert tailed(topics, "prompts", "p", 0) == []


def test_a_record_that_is_not_what_its_topic_holds_is_shown_as_such() -> None:
    hostile = record("p", 0, 7, b'{"request_id": "x\\u001b[2J"}',
                     headers=(("context-assembler.source.topic", b"in"),
                              ("context-assembler.source.partition", b"zero"),
                              ("context-assembler.source.offset", b"1")))
    line = render("prompts", hostile)
    assert line.startswith("not a prompts record: ") and "\x1b" not in line
    assert answered_input(Origin.from_record(hostile).headers) is None


def test_a_record_batch_skipped_unread_is_shown_as_such() -> None:
    skipped = SkippedBatch(first_offset=7, last_offset=9, codec="gzip", compressed_bytes=500_000,
                           limit=1 << 25, declared=None)
    for kind in ("prompts", "audit", "dlq"):
        assert render(kind, record("p", 0, 9, skipped)) == (
            "not read: record batch at offsets 7-9 (gzip, 500000 bytes compressed) "
            "decompresses to more, over max_batch_bytes=33554432: skipped unread")


def test_produce_wait_counts_each_sent_events_answer_once() -> None:
    topics = published()
    topics.append("p", 0, topics.partition("p", 0)[0].value,  # an at-least-once copy
                  headers=topics.partition("p", 0)[0].headers)
    starts = {TopicPartition(t, p): 0 for t in ("p", "d") for p in (0, 1)}
    sent = [("in", 0, 0), ("in", 0, 1), ("in", 1, 1)]

    async def wait(timeout: float) -> module.Answers:
        return await wait_for_answers(FakeReader(topics), starts, "p", sent, timeout)

    answers = asyncio.run(wait(30))
    assert (answers.prompts, answers.waiting) == (2, set())
    (letter,) = answers.dead_letters
    assert letter.startswith("bad-1  RejectedInput.schema")

    unanswered = asyncio.run(wait_for_answers(FakeReader(topics), starts, "p",
                                              [*sent, ("in", 5, 0)], 0.2))
    assert unanswered.waiting == {("in", 5, 0)} and unanswered.prompts == 2
