"""`context-assembler redrive`: dead letters back to the input topic, once what rejected
them is fixed.

A dead letter holds the original key, value bytes and headers (Kafka Connect style) plus the
`__connect.errors.*` headers, so re-submitting it is sending those back. The DLQ is read by
offsets or time without a consumer group (the replay's reader): nothing is joined, committed
or deleted. Each re-driven record carries a count header that a new dead letter keeps (the
worker copies an input's headers into its dead letter), so a record that keeps failing is
skipped once it has been re-driven `max_redrives` times. A dead letter cut to fit the DLQ
holds only the first bytes of its input: it is skipped, since re-sending it would submit
another event.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata

from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.records import (
    ERR,
    TRUNCATED,
    Headers,
    Origin,
    SkippedBatch,
    header,
    value_of,
)
from context_assembler.kafka.tools.produce import check_topic
from context_assembler.kafka.tools.reader import TopicReader
from context_assembler.settings import Settings

REDRIVES = "context-assembler.redrive.count"
REASON = f"{ERR}exception.class.name"


@dataclass
class RedriveRequest:
    """What to re-drive. `settings`: the brokers, the DLQ and input topics, the security,
    and the producer's largest record and compression, as the worker has them."""

    settings: Settings
    starts: list[tuple[int, int]] = field(default_factory=list)
    from_ms: int | None = None
    ends: list[tuple[int, int]] = field(default_factory=list)
    to_ms: int | None = None
    count: int | None = None
    max_redrives: int = 3
    send: bool = False  # --yes; the default is a dry run

    @functools.cached_property
    def clients(self) -> KafkaClients:
        return KafkaClients.of(self.settings)


@dataclass(frozen=True)
class Letter:
    """One dead letter: where it is, why it was rejected, and what re-driving it sends."""

    origin: Origin
    reason: str
    redrives: int

    @property
    def request_id(self) -> str:
        return (self.origin.key or b"").decode("utf-8", "replace")

    def resubmitted(self) -> Headers:
        """The input's own headers, without the error ones, and the count one higher."""
        kept = tuple((k, v) for k, v in self.origin.headers
                     if not k.startswith(ERR) and k != REDRIVES)
        return (*kept, (REDRIVES, str(self.redrives + 1).encode()))


@dataclass
class RedriveReport:
    groups: dict[str, list[Letter]]  # reason -> what is (or would be) re-driven
    at_maximum: list[Letter]
    truncated: list[Letter]
    sent: bool
    next_start: dict[int, int]  # partition -> the offset after the last dead letter read
    resent: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) on input
    unread: list[Letter] = field(default_factory=list)  # batches over max_batch_bytes

    def render(self, topic: str, max_redrives: int) -> list[str]:
        lines = []
        verb = "re-drove" if self.sent else "would re-drive"
        for reason, letters in sorted(self.groups.items()):
            lines.append(f"{verb} {len(letters)}  {reason}")
            lines.extend(f"    {letter.origin}  {letter.request_id}" for letter in letters)
        for letters, why in (
            (self.at_maximum, f"skipped: re-driven {max_redrives} times already"),
            (self.truncated, "skipped: cut to fit the DLQ, the original value is not stored"),
            (self.unread, "skipped: not read, its record batch is too large decompressed"),
        ):
            if letters:
                lines.append(f"{why}: {len(letters)}")
                lines.extend(f"    {letter.origin}  {letter.request_id}  {letter.reason}"
                             for letter in letters)
        total = sum(len(letters) for letters in self.groups.values())
        summary = f"{verb} {total} dead letters to {topic}"
        if not self.sent:
            summary += " (dry run: --yes sends them)"
        if self.next_start:
            summary += "; next run: " + " ".join(
                f"--from {p}:{o}" for p, o in sorted(self.next_start.items()))
        return [*lines, summary]


_COUNT = re.compile(rb"[0-9]{1,9}")


def letter_of(origin: Origin) -> Letter:
    reason = header(origin.headers, REASON)
    count = header(origin.headers, REDRIVES)
    # Only what `resubmitted` writes: a plain decimal count. Anything else (-1000000, +1,
    # " 2", 1_0, a hundred digits) is not ours: count it as re-driven already, as often as
    # allowed, so a forged header can never buy a record more re-drives.
    redrives = int(count) if count is not None and _COUNT.fullmatch(count) else (
        0 if count is None else 1 << 30)
    return Letter(origin, (reason or b"unknown").decode("utf-8", "replace"), redrives)


async def redrive(request: RedriveRequest) -> RedriveReport:
    """Read the DLQ range and sort its letters; with `send`, publish each re-drivable one to
    the input topic as it is read (acks=all, idempotent, in DLQ order, so one request's
    letters arrive in the order they were rejected), and return once the broker has them
    all. Values are never held: a dry run keeps headers only."""
    report = RedriveReport({}, [], [], request.send, {})
    async with contextlib.AsyncExitStack() as stack:
        producer = await stack.enter_async_context(_producer(request)) if request.send else None
        reader = await stack.enter_async_context(TopicReader(request.clients))
        spans = await reader.spans(request.settings.dlq_topic, starts=request.starts,
                                   from_ms=request.from_ms, ends=request.ends, to_ms=request.to_ms)
        sent: list[asyncio.Future[RecordMetadata]] = []
        read = 0
        async for record in reader.read(request.settings.dlq_topic, spans):
            letter = letter_of(Origin.from_record(record))
            report.next_start[record.partition] = record.offset + 1
            read += 1
            if isinstance(record.value, SkippedBatch):
                report.unread.append(Letter(letter.origin, record.value.message, 0))
            elif header(letter.origin.headers, TRUNCATED) is not None:
                report.truncated.append(letter)
            elif letter.redrives >= request.max_redrives:
                report.at_maximum.append(letter)
            else:
                report.groups.setdefault(letter.reason, []).append(letter)
                if producer is not None:
                    sent.append(await producer.send(
                        request.settings.input_topic, value_of(record), key=letter.origin.key,
                        headers=list(letter.resubmitted())))
            if request.count and read >= request.count:
                break
        for delivery in sent:
            metadata = await delivery
            report.resent.append((metadata.partition, metadata.offset))
    return report


@contextlib.asynccontextmanager
async def _producer(request: RedriveRequest) -> AsyncIterator[AIOKafkaProducer]:
    await check_topic(request.clients, request.settings.input_topic)
    producer = request.clients.producer()
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()
