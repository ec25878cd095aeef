"""Delivery decisions of the shared runner, with a fake send instead of a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from faust.exceptions import ProducerSendError

from tests.kafka.test_records import GOOD, origin
from worker.engine.policy import Policy
from worker.intake.policies import PolicyRegistry
from worker.kafka import runner as runner_module
from worker.kafka.observability.metrics import Metrics
from worker.kafka.records import ERR, OutRecord, record_size
from worker.kafka.runner import EventRunner, Stopped, persistent, too_large
from worker.kafka.settings import Settings


def wrapped(error: Exception) -> ProducerSendError:
    """As faust raises it: its own error, from aiokafka's."""
    try:
        raise ProducerSendError(f"Error while sending: {error!r}") from error
    except ProducerSendError as outer:
        return outer


def test_too_large_and_persistent_errors_are_told_apart() -> None:
    assert too_large(MessageSizeTooLargeError()) and too_large(wrapped(MessageSizeTooLargeError()))
    assert not too_large(KafkaTimeoutError())
    for transient in (KafkaTimeoutError(), KafkaConnectionError(), NotLeaderForPartitionError()):
        assert not persistent(transient) and not persistent(wrapped(transient))
    for stuck in (TopicAuthorizationFailedError(), UnknownTopicOrPartitionError(), ValueError()):
        assert persistent(stuck) and persistent(wrapped(stuck))


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Calls of the hard exit, which must never end the test process."""
    calls: list[float] = []
    monkeypatch.setattr(runner_module, "_exit_now", calls.append)
    yield calls


def make(**settings: object) -> EventRunner:
    values: dict[str, object] = {"prompts_topic": "prompts", "audit_topic": "audit",
                                 "dlq_topic": "dlq", "retry_backoff_max_seconds": 0.05}
    values.update(settings)
    return EventRunner(Settings.model_validate(values), PolicyRegistry(Policy()), Metrics())


async def test_a_refused_output_turns_the_event_into_an_output_too_large_dead_letter() -> None:
    runner = make()
    outcome = await runner.process(GOOD, origin())
    sent: list[OutRecord] = []

    async def send(record: OutRecord) -> None:
        if record.topic == "prompts":
            raise wrapped(MessageSizeTooLargeError())  # the topic allows less than we do
        sent.append(record)

    await runner.deliver(GOOD, origin(), outcome, send)
    audit, letter = sorted(sent, key=lambda r: r.topic)  # the audit went out first: documented
    assert audit.topic == "audit" and (letter.topic, letter.value) == ("dlq", GOOD)
    assert dict(letter.headers)[f"{ERR}exception.class.name"] == b"RejectedInput.output_too_large"
    # The next event with so large a prompt is dead-lettered before anything is sent.
    again = await runner.process(GOOD, origin())
    assert again.rejected is not None and again.rejected.reason == "output_too_large"
    runner.close()


async def test_a_refused_dead_letter_is_cut_until_the_topic_takes_it() -> None:
    runner = make()
    raw = b'{"request_id": "big", "padding": "' + b"x" * 200_000 + b'"}'
    outcome = await runner.process(raw, origin())
    sizes: list[int] = []

    async def send(record: OutRecord) -> None:
        sizes.append(record_size(record))
        if sizes[-1] > 40_000:
            raise MessageSizeTooLargeError()

    await runner.deliver(raw, origin(), outcome, send)
    assert sizes[0] > 200_000 and sizes[-1] <= 40_000 and len(sizes) <= 5
    assert runner.blocked is None
    runner.close()


async def test_a_persistent_failure_blocks_readiness_and_stop_ends_the_retries(
    exits: list[float],
) -> None:
    runner = make(shutdown_grace_seconds=0.4)
    outcome = await runner.process(b"{bad", origin())
    attempts = 0

    async def send(record: OutRecord) -> None:
        nonlocal attempts
        attempts += 1
        raise TopicAuthorizationFailedError()

    task = runner.spawn(runner.deliver(b"{bad", origin(), outcome, send))
    while attempts < 3:
        await asyncio.sleep(0.01)
    assert runner.blocked is not None and "TopicAuthorizationFailed" in runner.blocked
    assert not task.done()
    runner.stop()
    with pytest.raises(Stopped):
        await asyncio.wait_for(task, 0.1)  # backoff sleeps end at once
    assert runner.blocked is None
    await asyncio.sleep(0.5)
    assert exits == [0.4]  # the hard exit is armed for the end of the grace period
    runner.close()


async def test_stop_cancels_a_delivery_still_hanging_after_half_the_grace_period(
    exits: list[float],
) -> None:
    runner = make(shutdown_grace_seconds=0.4)
    outcome = await runner.process(GOOD, origin())

    async def hang(record: OutRecord) -> None:
        await asyncio.sleep(3600)  # waiting for metadata of a topic that does not exist

    task = runner.spawn(runner.deliver(GOOD, origin(), outcome, hang))
    await asyncio.sleep(0.05)
    runner.stop()
    started = asyncio.get_running_loop().time()
    await runner.drained()
    assert task.cancelled()
    assert 0.15 <= asyncio.get_running_loop().time() - started < 0.35
    runner.close()
