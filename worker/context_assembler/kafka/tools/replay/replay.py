"""Replay input events from the topic, re-assemble them, and compare with what was published.

The input is read by offsets or time without a consumer group (`reader`), so the worker's
group and its committed offsets are never touched. Each event goes through the worker's own
`handle`, so the same policy gives the same bytes the worker published. Under the recorded
policies, each event is handled under the policy whose hash its published prompt carries,
read from the policies topic (or a file); a hash not recorded stops the replay before it
writes anything. A framed event (a schema registry's wire format) is checked against its
schema as the worker checks it when the registry is set, else its JSON is read unchecked;
framed outputs are compared by their JSON. Results are written whole or not at all: files
are renamed into place at the end (`outputs`), topics are written in one transaction.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiokafka import AIOKafkaProducer
from pydantic import ValidationError

from context_assembler.contract.models import AssembledPrompt
from context_assembler.diagnose.compare import Comparison, compare
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.intake.codec import encode
from context_assembler.intake.framing import schema_id_of, unframed
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.intake.recorded_policies import (
    PinnedRegistry,
    PolicyNotRecorded,
    RecordedPolicies,
)
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import (
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    HandlerContext,
    Headers,
    Origin,
    Outcome,
    handle,
    header,
    value_of,
)
from context_assembler.kafka.schema_registry import SchemaRegistry
from context_assembler.kafka.tools.policies_topic import read_policies
from context_assembler.kafka.tools.reader import RangeError, Span, TopicReader, describe_range, iso
from context_assembler.kafka.tools.replay.outputs import OutputFiles, Progress, output_files
from context_assembler.kafka.tuning import REPLAY_TRANSACTION_TIMEOUT_MS
from context_assembler.settings import Settings

Coordinates = tuple[int, int]  # input partition, offset


class NotRecorded(ContextAssemblerError, LookupError):
    """What explain --kafka looks for is not on the topics (any more)."""


@dataclass
class ReplayRequest:
    """What to replay. `settings`: the brokers, the topics, the limits, the security, the
    compression of --to-topic's producer and the schema registry, as the worker has them;
    with a registry set, a framed event is checked against its schema as the worker checks
    it, else its JSON is read unchecked."""

    settings: Settings
    registry: PolicyRegistry  # the policy of the events: --policy, else the setting's
    starts: list[tuple[int, int]] = field(default_factory=list)
    from_ms: int | None = None
    ends: list[tuple[int, int]] = field(default_factory=list)
    to_ms: int | None = None
    count: int | None = None
    out: Path | None = None
    audit_out: Path | None = None
    errors_out: Path | None = None
    to_topic: str | None = None
    to_audit_topic: str | None = None
    compare: bool = False
    # Under the recorded policies: from `policies` (a file's), else the policies topic.
    recorded: bool = False
    policies: RecordedPolicies | None = None

    @functools.cached_property
    def clients(self) -> KafkaClients:
        return KafkaClients.of(self.settings)


@dataclass
class Replayed:
    coordinates: Coordinates
    request_id: str
    timestamp_ms: int | None
    result: tuple[bytes, bytes] | str  # (prompt, audit) bytes, or the rejection

    @classmethod
    def of(cls, origin: Origin, outcome: Outcome) -> Replayed:
        coordinates = (origin.partition, origin.offset)
        if outcome.assembly is not None:
            prompt, audit = outcome.assembly.prompt, outcome.assembly.audit
            return cls(coordinates, prompt.request_id, origin.timestamp_ms,
                       (encode(prompt), encode(audit)))
        rejected = outcome.rejected
        assert rejected is not None  # handle gives one or the other
        return cls(coordinates, rejected.request_id or "?", origin.timestamp_ms,
                   f"{rejected.reason}: {rejected.message}")


@dataclass
class ReplayReport:
    replayed: list[Replayed]
    comparisons: list[Comparison]
    interrupted: bool
    # Under the recorded policies: events without a published prompt, so without a recorded
    # policy, which were handled under the request's registry (the operator's policies).
    unrecorded: int = 0


Published = tuple[dict[Coordinates, bytes], dict[Coordinates, bytes]]  # prompts, audits
ContextFor = Callable[[Coordinates], HandlerContext]


async def replay(request: ReplayRequest, stop: asyncio.Event) -> ReplayReport:
    """Replay the requested range of the input topic; compare with what was published if
    asked. Outputs are kept (whole) also when `stop` ends the replay early."""
    settings = request.settings
    schemas = SchemaRegistry(settings) if settings.schema_registry_url else None
    try:
        return await _replay(request, stop, schemas)
    finally:
        if schemas is not None:
            await schemas.close()


async def _replay(request: ReplayRequest, stop: asyncio.Event,
                  schemas: SchemaRegistry | None) -> ReplayReport:
    async with TopicReader(request.clients) as reader:
        spans = await reader.spans(request.settings.input_topic, starts=request.starts,
                                   from_ms=request.from_ms, ends=request.ends, to_ms=request.to_ms)
        if not any(span.end > span.start for span in spans):
            raise await _empty_range(reader, request)
        published: Published | None = None
        default = _handler_context(request, request.registry)
        context_for: ContextFor = lambda _: default  # noqa: E731
        if request.recorded:
            published = await _published_for_spans(reader, request, spans)
            context_for = await _recorded_contexts(reader, request, published[0], default)
        replayed = await _replay_spans(reader, request, spans, stop, context_for, schemas)
        comparisons = (await _compare(reader, request, replayed, published)
                       if request.compare else [])
    unrecorded = (sum(r.coordinates not in published[0] for r in replayed)
                  if published is not None else 0)
    return ReplayReport(replayed, comparisons, stop.is_set(), unrecorded)


async def _empty_range(reader: TopicReader, request: ReplayRequest) -> RangeError:
    """A range with no event in it: which range, and where the topic's records are."""
    asked = describe_range(request.starts, request.from_ms, request.ends, request.to_ms)
    topic = request.settings.input_topic
    times = await reader.record_times(topic)
    stored = ("it holds no record" if times is None
              else f"its records run from {iso(times[0])} to {iso(times[1])}")
    return RangeError(f"nothing to replay: no event on {topic} {asked}; {stored}")


async def _published_for_spans(
    reader: TopicReader, request: ReplayRequest, spans: Sequence[Span]
) -> Published:
    """What the worker published for the events of `spans` (the first `count`): a first
    pass over the input finds their coordinates and earliest timestamp."""
    wanted: set[Coordinates] = set()
    from_ms: int | None = None
    async for record in reader.read(request.settings.input_topic, spans):
        wanted.add((record.partition, record.offset))
        if record.timestamp is not None:
            from_ms = record.timestamp if from_ms is None else min(from_ms, record.timestamp)
        if request.count and len(wanted) >= request.count:
            break
    if not wanted:
        return {}, {}
    return await _published_pair(reader, request, wanted, from_ms or 0)


async def _recorded_contexts(
    reader: TopicReader, request: ReplayRequest, prompts: dict[Coordinates, bytes],
    default: HandlerContext,
) -> ContextFor:
    """For each event, the worker's handling under the policy its published prompt names
    (and the prompt's own name for it); `default` for an event without a published prompt.
    Raises PolicyNotRecorded, naming each hash not recorded, before anything is replayed."""
    refs: dict[Coordinates, tuple[str, str]] = {}
    for coordinates, prompt in prompts.items():
        try:
            named = AssembledPrompt.model_validate_json(prompt).policy
        except ValidationError:
            where = "{}/{}/{}".format(request.settings.input_topic, *coordinates)
            raise PolicyNotRecorded(f"the prompt published for {where} is not an "
                                    "AssembledPrompt: its policy cannot be told") from None
        refs[coordinates] = (named.hash, named.name)
    recorded = request.policies
    if recorded is None:
        recorded = await read_policies(reader, request.settings.policies_topic)
    contexts: dict[tuple[str, str], HandlerContext] = {}
    problems: dict[str, str] = {}  # hash -> why it cannot be had
    for coordinates, ref in sorted(refs.items()):
        if ref in contexts or ref[0] in problems:
            continue
        try:
            policy = recorded.policy(*ref)
        except PolicyNotRecorded as error:
            where = "{}/{}/{}".format(request.settings.input_topic, *coordinates)
            problems[ref[0]] = f"{error} (the policy of the prompt published for {where})"
            continue
        contexts[ref] = _handler_context(request, PinnedRegistry(policy))
    if problems:
        raise PolicyNotRecorded("; ".join(problems.values()))

    def context_for(coordinates: Coordinates) -> HandlerContext:
        ref = refs.get(coordinates)
        return default if ref is None else contexts[ref]

    return context_for


async def _replay_spans(
    reader: TopicReader, request: ReplayRequest, spans: Sequence[Span], stop: asyncio.Event,
    context_for: ContextFor, schemas: SchemaRegistry | None,
) -> list[Replayed]:
    """Handle each event of `spans` (at most `request.count`) as the worker would, and write
    the results: files renamed into place, the topic's transaction committed, at the end."""
    total = sum(span.end - span.start for span in spans)
    replayed: list[Replayed] = []
    async with _transaction(request) as producer:
        with (
            Progress(min(total, request.count) if request.count else total) as progress,
            output_files(request.out, request.audit_out, request.errors_out) as files,
        ):
            async for record in reader.read(request.settings.input_topic, spans):
                origin, raw = Origin.from_record(record), value_of(record)
                context = context_for((origin.partition, origin.offset))
                if schemas is None:
                    raw = unframed(raw)
                else:
                    schema_id = schema_id_of(raw)
                    ids = [] if schema_id is None else [schema_id]
                    context = replace(context, schemas=await schemas.resolve(ids))
                outcome = handle(raw, origin, context)
                await _write(outcome, origin, raw, files, producer)
                replayed.append(Replayed.of(origin, outcome))
                progress.step()
                if stop.is_set() or (request.count and len(replayed) >= request.count):
                    break
    return replayed


def _handler_context(request: ReplayRequest, registry: PolicyRegistry) -> HandlerContext:
    """The worker's handling under `registry`, but outputs bound for --to-topic (if any); a
    replay writes rejections to --errors only, never to the dead-letter topic."""
    settings, to_topic = request.settings, request.to_topic
    if to_topic:
        settings = settings.model_copy(update={
            "prompts_topic": to_topic,
            "audit_topic": request.to_audit_topic or f"{to_topic}.audit"})
    return HandlerContext(settings=settings, registry=registry)


@asynccontextmanager
async def _transaction(request: ReplayRequest) -> AsyncIterator[AIOKafkaProducer | None]:
    """With --to-topic, a producer in one transaction, committed if the block succeeds and
    aborted if it fails; else None."""
    if not request.to_topic:
        yield None
        return
    producer = request.clients.producer(
        transactional_id=f"context-assembler-replay-{uuid.uuid4()}",
        transaction_timeout_ms=REPLAY_TRANSACTION_TIMEOUT_MS,
    )
    await producer.start()
    try:
        await producer.begin_transaction()
        try:
            yield producer
            await producer.commit_transaction()
        except BaseException:
            await producer.abort_transaction()
            raise
    finally:
        await producer.stop()


async def _write(
    outcome: Outcome, origin: Origin, raw: bytes, files: OutputFiles,
    producer: AIOKafkaProducer | None,
) -> None:
    """One event's results: to the files, and its prompt and audit to --to-topic."""
    files.write(outcome, origin, raw)
    if producer is not None and outcome.assembly is not None:
        for out in outcome.records:
            await producer.send(out.topic, out.value, key=out.key, headers=list(out.headers))


async def _compare(
    reader: TopicReader, request: ReplayRequest, replayed: Sequence[Replayed],
    found: Published | None,
) -> list[Comparison]:
    """Each replayed event beside the prompt and audit the worker published for it
    (`found`: already read)."""
    if not replayed:
        return []
    if found is None:
        from_ms = min((r.timestamp_ms for r in replayed if r.timestamp_ms is not None),
                      default=0)
        found = await _published_pair(reader, request, {r.coordinates for r in replayed},
                                      from_ms)
    prompts, audits = found
    published = {key: (prompts[key], audits[key]) for key in prompts if key in audits}
    return [
        compare(r.request_id, "{}/{}/{}".format(request.settings.input_topic, *r.coordinates),
                published.get(r.coordinates), r.result)
        for r in replayed
    ]


async def _published_pair(
    reader: TopicReader, request: ReplayRequest, wanted: set[Coordinates], from_ms: int
) -> Published:
    """The prompts and the audits the worker published for the inputs, found by source
    headers.

    Outputs carry their input's timestamp, so they all sit at or after the first output
    stamped `from_ms`; both topics are read from there to their current end.
    """
    settings = request.settings
    prompts = await _published(reader, settings.prompts_topic, settings.input_topic, wanted,
                               from_ms)
    audits = await _published(reader, settings.audit_topic, settings.input_topic, wanted, from_ms)
    return prompts, audits


async def _published(
    reader: TopicReader, topic: str, input_topic: str, wanted: set[Coordinates], from_ms: int
) -> dict[Coordinates, bytes]:
    """The first value on `topic` from `from_ms` on of each wanted input of `input_topic`."""
    spans = await reader.spans(topic, from_ms=from_ms)
    hits: dict[Coordinates, bytes] = {}
    async for record in reader.read(topic, spans):
        source = _source(Origin.from_record(record).headers)
        if source is None or source[0] != input_topic:
            continue
        key = source[1:]
        if key in wanted:
            # At-least-once copies are identical; a framed output is compared by its JSON.
            hits.setdefault(key, unframed(value_of(record)))
    return hits


def _source(headers: Headers) -> tuple[str, int, int] | None:
    """The input an output came from (topic, partition, offset), from its source headers."""
    topic, partition, offset = (header(headers, name)
                                for name in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET))
    if topic is None or partition is None or offset is None:
        return None
    try:
        return topic.decode(), int(partition), int(offset)
    except ValueError:  # not ours: another producer's headers
        return None


async def find_recorded(
    clients: KafkaClients, audit_topic: str, request_id: str, from_ms: int | None,
) -> tuple[bytes, bytes, str]:
    """The latest audit published for `request_id`, the input event it came from, and
    where that was ("topic/partition/offset")."""
    async with TopicReader(clients) as reader:
        spans = await reader.spans(audit_topic, from_ms=from_ms)
        latest: Origin | None = None
        audit = b""
        async for record in reader.read(audit_topic, spans):
            if record.key == request_id.encode():
                latest, audit = Origin.from_record(record), unframed(value_of(record))
        if latest is None:
            raise NotRecorded(f"no audit for request {request_id!r} on {audit_topic}")
        source = _source(latest.headers)
        if source is None:
            raise NotRecorded(f"the audit of {request_id!r} does not say where its input came from")
        topic, partition, offset = source
        events = [value_of(record)
                  async for record in reader.read(topic, [Span(partition, offset, offset + 1)])]
        if not events:
            raise NotRecorded(f"the input {topic}/{partition}/{offset} is no longer stored")
        return unframed(events[-1]), audit, f"{topic}/{partition}/{offset}"
