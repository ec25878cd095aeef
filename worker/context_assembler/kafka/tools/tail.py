"""Read the worker's outputs as a person would: `tail prompts|audit|dlq` and `produce --wait`.

Both read without a consumer group (nothing joined or committed), read_committed. Each
record is one line: the request, what was decided, and the input it answers
(`topic/partition/offset`, the `--from` of replay). Records are written by whoever can
write to the topics, so each is parsed as untrusted: a record that is not what the topic
should hold is shown as such, and every line goes through `printable`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from context_assembler.contract.models import AssembledPrompt, AssemblyAudit
from context_assembler.diagnose.explain import printable
from context_assembler.intake.framing import unframed
from context_assembler.kafka.records import (
    ERR,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    Headers,
    Origin,
    SkippedBatch,
    header,
    value_of,
)
from context_assembler.kafka.tools.reader import Span, TopicReader

OUTPUTS = ("prompts", "audit", "dlq")
SHOWN_VALUE_CHARS = 200  # of a record that is not what its topic should hold
_SOURCES = ((SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET),
            (f"{ERR}topic", f"{ERR}partition", f"{ERR}offset"))

Coordinates = tuple[str, int, int]  # topic, partition, offset


def answered_input(headers: Headers) -> Coordinates | None:
    """The input an output or a dead letter answers, from its headers; None if not said."""
    for names in _SOURCES:
        topic, partition, offset = (header(headers, name) for name in names)
        if topic is not None and partition is not None and offset is not None:
            try:
                return topic.decode(), int(partition), int(offset)
            except ValueError:  # not ours
                return None
    return None


def _prompt_line(value: bytes) -> str:
    prompt = AssembledPrompt.model_validate_json(value)
    tokens = prompt.tokens
    labels = " ".join(f"[{c.label}]" for c in prompt.citations) or "nothing"
    return (f"{prompt.request_id}  prompt {tokens.prompt} tokens, context {tokens.context} of "
            f"{tokens.budget}  policy {prompt.policy.name}  cites {labels}"
            + ("  (abstained: nothing usable)" if prompt.abstained else ""))


def _audit_line(value: bytes) -> str:
    audit = AssemblyAudit.model_validate_json(value)
    dropped = ", ".join(f"{d.chunk_id} {d.reason}" for d in audit.dropped)
    return (f"{audit.request_id}  kept {len(audit.kept)}, dropped {len(audit.dropped)}"
            + (f": {dropped}" if dropped else ""))


def _dead_letter_line(key: bytes | None, value: bytes, headers: Headers) -> str:
    exception = header(headers, f"{ERR}exception.class.name") or b"(no reason given)"
    message = header(headers, f"{ERR}exception.message") or b""
    request = key.decode(errors="replace") if key else "(no key)"
    return (f"{request}  {exception.decode(errors='replace')}: "
            f"{message.decode(errors='replace')}  ({len(value)} bytes)")


def render(kind: str, record: ConsumerRecord) -> str:
    """One readable line for a record of the `kind` output topic."""
    origin = Origin.from_record(record)
    value = value_of(record)
    try:
        if isinstance(value, SkippedBatch):
            line = f"not read: {value.message}"
        elif kind == "prompts":
            line = _prompt_line(unframed(value))
        elif kind == "audit":
            line = _audit_line(unframed(value))
        else:
            line = _dead_letter_line(origin.key, value, origin.headers)
    except ValidationError:
        shown = value[:SHOWN_VALUE_CHARS].decode(errors="replace")
        line = f"not a {kind} record: {shown!r}"
    source = answered_input(origin.headers)
    answers = "  from {}/{}/{}".format(*source) if source else ""
    return printable(f"{line}{answers}")


async def _ends(reader: TopicReader, topic: str) -> dict[int, tuple[int, int]]:
    return await reader.bounds(topic, await reader.partitions(topic))


async def tail(
    reader: TopicReader, kind: str, topic: str, count: int, follow: bool,
    write: Callable[[str], None],
) -> None:
    """The last `count` records of `topic`, oldest first (by timestamp); with `follow`,
    then each new one as it arrives, until cancelled."""
    bounds = await _ends(reader, topic)
    spans = [Span(p, max(first, end - count), end) for p, (first, end) in bounds.items()]
    # compacted: a span may begin on a transaction marker, which is no record
    last = [r async for r in reader.read(topic, spans, compacted=True)]
    last.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    for record in last[len(last) - count:] if count else []:
        write(render(kind, record))
    if follow:
        ends = {TopicPartition(topic, p): end for p, (_, end) in bounds.items()}
        async for record in reader.follow(ends):
            write(render(kind, record))


@dataclass
class Answers:
    """What came back for the events `produce --wait` sent."""

    waiting: set[Coordinates]
    prompts: int = 0
    dead_letters: list[str] = field(default_factory=list)


async def output_ends(reader: TopicReader, topics: Sequence[str]) -> dict[TopicPartition, int]:
    """Where each output topic ends now: answers to what is sent next come after."""
    ends = {}
    for topic in topics:
        for partition, (_, end) in (await _ends(reader, topic)).items():
            ends[TopicPartition(topic, partition)] = end
    return ends


async def wait_for_answers(
    reader: TopicReader, starts: dict[TopicPartition, int], prompts_topic: str,
    sent: Iterable[Coordinates], timeout: float,
) -> Answers:
    """Read the prompts and dead-letter topics from `starts` until every event `sent` has
    its prompt or its dead letter, or `timeout` seconds have passed."""
    answers = Answers(set(sent))
    if not answers.waiting:
        return answers
    try:
        async with asyncio.timeout(timeout):
            async for record in _answers(reader, starts, answers.waiting):
                if record.topic == prompts_topic:
                    answers.prompts += 1
                else:
                    answers.dead_letters.append(render("dlq", record))
                if not answers.waiting:
                    break
    except TimeoutError:
        pass
    return answers


async def _answers(
    reader: TopicReader, starts: dict[TopicPartition, int], waiting: set[Coordinates]
) -> AsyncIterator[ConsumerRecord]:
    """The records answering an event in `waiting`, each once (which it removes)."""
    async for record in reader.follow(starts):
        source = answered_input(Origin.from_record(record).headers)
        if source in waiting:
            waiting.discard(source)
            yield record
