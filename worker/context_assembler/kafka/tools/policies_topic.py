"""The policies topic: the worker records its policies there before it consumes; replay,
explain and `policy --diff` read it back.

Compacted and keyed by hash, it holds one record per policy ever used, so it stays small and
is read whole. The worker publishes with a short-lived idempotent producer (acks=all) before
its consumer starts: no event is assembled under a policy that is not on the topic. A missing
topic or an unreachable broker is logged and retried, never skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from aiokafka.errors import KafkaError

from context_assembler.engine.policy import Policy
from context_assembler.intake.framing import frame, unframed
from context_assembler.intake.recorded_policies import RecordedPolicies, record_bytes
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import SkippedBatch
from context_assembler.kafka.tools.produce import check_topic
from context_assembler.kafka.tools.reader import TopicReader
from context_assembler.kafka.tools.topics import TopicError
from context_assembler.kafka.tuning import FIRST_PUBLISH_RETRY_SECONDS
from context_assembler.settings import Settings

log = logging.getLogger(__name__)


async def publish(clients: KafkaClients, topic: str, policies: Sequence[Policy],
                  schema_id: int | None = None) -> None:
    """Each policy's record, keyed by its hash (framed with `schema_id`, if given); returns
    once the broker has them all."""
    producer = clients.producer()
    try:
        await producer.start()
        values = [record_bytes(p) for p in policies]
        if schema_id is not None:
            values = [frame(schema_id, value) for value in values]
        sent = [await producer.send(topic, value, key=p.hash.encode())
                for p, value in zip(policies, values, strict=True)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


class Recording:
    """Publishing the policies at start: what /ready answers meanwhile."""

    def __init__(self) -> None:
        self.problem: str | None = None  # the last thing that stopped it, if any
        self.problems: list[str] = []  # what stopped an earlier step (the schema registry)

    def reason(self) -> str:
        detail = self.problem or (self.problems[-1] if self.problems else "publishing")
        return f"not consuming yet: cannot record the policies: {detail}"


async def publish_at_start(
    settings: Settings, policies: Sequence[Policy], stop: asyncio.Event,
    recording: Recording | None = None, schema_id: int | None = None,
) -> bool:
    """True once every policy is on the policies topic; False if `stop` came first. Each new
    problem (a missing topic, a broker that does not answer) is logged once and kept in
    `recording`, then retried."""
    recording = recording or Recording()
    clients = KafkaClients.of(settings)
    delay = FIRST_PUBLISH_RETRY_SECONDS
    topic = settings.policies_topic
    while not stop.is_set():
        try:
            await check_topic(clients, topic)
            await publish(clients, topic, policies, schema_id)
        except (TopicError, KafkaError, TimeoutError) as error:
            problem = str(error) or type(error).__name__
            if problem != recording.problem:
                log.error("cannot record the policies, so not consuming yet: %s", problem,
                          extra={"topic": topic})
                recording.problem = problem
        else:
            log.info("policies recorded", extra={
                "topic": topic, "policies": {p.name: p.hash for p in policies}})
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, settings.retry_backoff_max_seconds)
    return False


async def read_policies(reader: TopicReader, topic: str) -> RecordedPolicies:
    """Every record on the policies topic, in order (a compacted topic: gaps are normal)."""
    recorded = RecordedPolicies(f"topic {topic}")
    spans = await reader.spans(topic)
    async for record in reader.read(topic, spans, compacted=True):
        if isinstance(record.value, SkippedBatch):  # the policies it held are not recorded
            log.warning("%s/%d: %s", topic, record.partition, record.value.message)
            continue
        recorded.add(record.key or b"", None if record.value is None else unframed(record.value))
    return recorded


async def fetch_policies(clients: KafkaClients, topic: str) -> RecordedPolicies:
    async with TopicReader(clients) as reader:
        return await read_policies(reader, topic)
