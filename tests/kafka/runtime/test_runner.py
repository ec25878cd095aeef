"""Delivery decisions of the shared runner, with a fake send instead of a broker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

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

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.errors import too_large
from context_assembler.kafka.records import (
    ERR,
    HandlerContext,
    Origin,
    Outcome,
    OutRecord,
    handle,
    record_size,
)
from context_assembler.kafka.runtime.retries import Stopped, persistent
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tuning import PRODUCER_BATCH_BYTES
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings
from tests.kafka.conftest import make_runner
from tests.kafka.test_records import GOOD, origin


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


async def test_a_refused_output_turns_the_event_into_an_output_too_large_dead_letter() -> None:
    runner = make_runner()
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
    runner = make_runner()
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
    runner = make_runner(shutdown_grace_seconds=0.4)
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
    runner = make_runner(shutdown_grace_seconds=0.4)
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


def origins(count: int) -> list[Origin]:
    return [Origin("retrieval.results", 0, offset, b"k", (), 1_700_000_000_000)
            for offset in range(count)]


async def test_a_batch_is_handled_in_one_trip_and_in_order() -> None:
    events = [(GOOD, o) for o in origins(3)] + [(b"{bad", origins(4)[3])]
    threads: list[int] = []

    def counting(raw: bytes, at: Origin, context: HandlerContext) -> Outcome:
        threads.append(threading.get_ident())
        return handle(raw, at, context)

    settings = Settings.model_validate({"prompts_topic": "prompts", "audit_topic": "audit",
                                        "dlq_topic": "dlq"})
    runner = EventRunner(settings, PolicyRegistry(Policy()), Metrics(), counting)
    outcomes = await runner.process_all(events)
    assert [o.rejected is None for o in outcomes] == [True, True, True, False]
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()  # the engine thread
    assert runner.metrics.in_flight._value.get() == 4  # in flight until settled
    runner.close()


class Producer:
    """Hands out acknowledgements the test settles; `refuse` fails a record at once."""

    def __init__(self, refuse: Callable[[OutRecord], bool] = lambda record: False) -> None:
        self.sent: list[OutRecord] = []
        self.pending: list[tuple[OutRecord, asyncio.Future[object]]] = []
        self.refuse = refuse

    async def enqueue(self, origin: Origin, record: OutRecord) -> asyncio.Future[object]:
        if self.refuse(record):
            raise KafkaTimeoutError()  # no metadata for its topic, say
        self.sent.append(record)
        acknowledged: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.pending.append((record, acknowledged))
        return acknowledged

    def acknowledge(self, fail: Callable[[OutRecord], bool] = lambda record: False) -> None:
        for record, acknowledged in self.pending:
            if not acknowledged.done():
                if fail(record):
                    acknowledged.set_exception(NotLeaderForPartitionError())
                else:
                    acknowledged.set_result(None)


async def sending(runner: EventRunner, events: int, producer: Producer) -> asyncio.Task[None]:
    """`events` good events assembled in one batch, their delivery to `producer` under way."""
    batch = origins(events)
    outcomes = await runner.process_all([(GOOD, o) for o in batch])
    return asyncio.create_task(runner.deliver_all(
        [(GOOD, o, outcome) for o, outcome in zip(batch, outcomes, strict=True)],
        producer.enqueue))


async def test_a_batch_is_sent_at_once_and_only_its_failed_records_are_sent_again() -> None:
    runner = make_runner()
    producer = Producer()
    task = await sending(runner, 3, producer)
    await asyncio.sleep(0.01)
    assert len(producer.sent) == 6 and not task.done()  # every record before any ack
    failing = producer.sent[3]  # the second event's audit
    producer.acknowledge(fail=lambda record: record is failing)
    await asyncio.sleep(0.01)
    assert len(producer.sent) == 7 and producer.sent[6] == failing  # only it, again
    assert runner.metrics.in_flight._value.get() == 1  # the other two are settled
    assert runner.metrics.retries._value.get() == 1
    producer.acknowledge()
    await asyncio.wait_for(task, 1)
    assert runner.metrics.in_flight._value.get() == 0
    runner.close()


async def test_after_a_record_the_producer_refuses_the_rest_go_event_by_event() -> None:
    runner = make_runner(retry_backoff_max_seconds=0.05)
    refusing = [True]
    producer = Producer(refuse=lambda record: refusing[0] and record.topic == "audit")
    task = await sending(runner, 2, producer)
    await asyncio.sleep(0.01)
    # The first prompt went out; its audit was refused, so the second event was not tried
    # in the batch: its prompt and audit go with the retries, each once until acked.
    assert [r.topic for r in producer.sent[:1]] == ["prompts"]
    refusing[0] = False
    while not task.done():
        producer.acknowledge()
        await asyncio.sleep(0.01)
    await task
    assert sorted(r.topic for r in producer.sent) == ["audit", "audit", "prompts", "prompts"]
    assert runner.metrics.in_flight._value.get() == 0
    runner.close()


async def test_a_batch_cancelled_while_sending_is_settled_as_not_delivered() -> None:
    runner = make_runner()
    producer = Producer()
    task = await sending(runner, 2, producer)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert runner.metrics.in_flight._value.get() == 0
    runner.close()


async def test_a_record_refused_in_a_batch_is_sent_alone_before_anything_is_learned() -> None:
    runner = make_runner()
    outcome = await runner.process(GOOD, origin())
    alone: list[OutRecord] = []

    async def batched(record: OutRecord) -> None:
        raise wrapped(MessageSizeTooLargeError())  # its batch was over the topic's limit

    async def send_alone(record: OutRecord) -> None:
        alone.append(record)

    await runner.deliver(GOOD, origin(), outcome, batched, send_alone)
    assert sorted(r.topic for r in alone) == ["audit", "prompts"]  # as they were: no dead letter
    assert runner.batch_bytes == PRODUCER_BATCH_BYTES  # nothing learned
    runner.close()
