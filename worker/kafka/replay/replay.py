"""Replay input events from the topic, re-assemble them, and compare with what was published.

The input is read by offsets or time without a consumer group (worker.kafka.replay.reader), so the
worker's group and its committed offsets are never touched. Each event goes through the
worker's own `handle`, so the same policy gives the same bytes the worker published.
Results are written whole or not at all: files are renamed into place at the end, topics
are written in one transaction.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from aiokafka import AIOKafkaProducer

from worker.diagnose.compare import Comparison, compare
from worker.intake.codec import Limits, encode
from worker.intake.policies import PolicyRegistry
from worker.kafka.records import (
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    HandlerContext,
    Origin,
    handle,
    header,
)
from worker.kafka.replay.reader import Span, TopicReader

Coordinates = tuple[int, int]  # input partition, offset


@dataclass
class ReplayRequest:
    bootstrap_servers: str
    input_topic: str
    prompts_topic: str
    audit_topic: str
    registry: PolicyRegistry
    limits: Limits
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


@dataclass
class Replayed:
    coordinates: Coordinates
    request_id: str
    timestamp_ms: int
    result: tuple[bytes, bytes] | str  # (prompt, audit) bytes, or the rejection


@dataclass
class ReplayReport:
    replayed: list[Replayed]
    comparisons: list[Comparison]
    interrupted: bool


class Progress:
    """A one-line progress bar with rate and ETA, only when stderr is a terminal."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self._started = time.monotonic()
        self._shown = 0.0
        self._enabled = sys.stderr.isatty()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self._enabled and (now - self._shown > 0.2 or self.done == self.total):
            self._shown = now
            rate = self.done / max(now - self._started, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0
            share = self.done / self.total if self.total else 1
            bar = "#" * int(share * 30)
            print(f"\r[{bar:<30}] {self.done}/{self.total} {rate:6.0f} events/s ETA {eta:4.0f}s",
                  end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._enabled:
            print(file=sys.stderr)


@contextmanager
def atomic_outputs(paths: list[Path | None]) -> Iterator[list[BinaryIO | None]]:
    """Write to NAME.partial and rename on success; on failure nothing is left behind."""
    with ExitStack() as stack:
        partials = [None if p is None else p.with_name(p.name + ".partial") for p in paths]
        streams: list[BinaryIO | None] = [
            None if p is None else stack.enter_context(p.open("wb")) for p in partials
        ]
        try:
            yield streams
        except BaseException:
            stack.close()
            for partial in partials:
                if partial is not None:
                    partial.unlink(missing_ok=True)
            raise
        stack.close()
        for partial, path in zip(partials, paths, strict=True):
            if partial is not None and path is not None:
                partial.replace(path)


async def published_outputs(
    reader: TopicReader, request: ReplayRequest, wanted: set[Coordinates], from_ms: int
) -> dict[Coordinates, tuple[bytes, bytes]]:
    """The prompt and audit the worker published for each input, found by source headers.

    Outputs carry their input's timestamp, so they all sit at or after the first output
    stamped `from_ms`; both topics are read from there to their current end.
    """
    found: dict[str, dict[Coordinates, bytes]] = {}
    for topic in (request.prompts_topic, request.audit_topic):
        partitions = await reader.partitions(topic)
        bounds = await reader.bounds(topic, partitions)
        starts = await reader.offsets_at(topic, partitions, from_ms)
        spans = []
        for partition in partitions:
            start, end = starts[partition], bounds[partition][1]
            spans.append(Span(partition, end if start is None else start, end))
        hits: dict[Coordinates, bytes] = {}
        async for record in reader.read(topic, spans):
            headers = list(record.headers)
            if header(headers, SOURCE_TOPIC) != request.input_topic.encode():
                continue
            source_partition = header(headers, SOURCE_PARTITION)
            source_offset = header(headers, SOURCE_OFFSET)
            if source_partition is None or source_offset is None:
                continue
            key = (int(source_partition), int(source_offset))
            if key in wanted:
                hits.setdefault(key, record.value)  # at-least-once copies are identical
        found[topic] = hits
    prompts, audits = found[request.prompts_topic], found[request.audit_topic]
    return {key: (prompts[key], audits[key]) for key in prompts if key in audits}


async def replay(request: ReplayRequest, stop: asyncio.Event) -> ReplayReport:
    producer: AIOKafkaProducer | None = None
    replayed: list[Replayed] = []
    async with TopicReader(request.bootstrap_servers) as reader:
        spans = await reader.spans(request.input_topic, starts=request.starts,
                                   from_ms=request.from_ms, ends=request.ends, to_ms=request.to_ms)
        total = sum(s.end - s.start for s in spans)
        progress = Progress(min(total, request.count) if request.count else total)
        if request.to_topic:
            producer = AIOKafkaProducer(
                bootstrap_servers=request.bootstrap_servers,
                transactional_id=f"context-assembler-replay-{uuid.uuid4()}",
                transaction_timeout_ms=900_000,
            )
            await producer.start()
            await producer.begin_transaction()
        context = HandlerContext(
            request.registry, request.limits, request.to_topic or request.prompts_topic,
            request.to_audit_topic or f"{request.to_topic}.audit", "dead-letters", "replay",
        )
        try:
            with atomic_outputs([request.out, request.audit_out, request.errors_out]) as files:
                prompts_file, audits_file, errors_file = files
                async for record in reader.read(request.input_topic, spans):
                    origin = Origin(record.topic, record.partition, record.offset, record.key,
                                    tuple(record.headers), record.timestamp)
                    raw = record.value or b""
                    outcome = handle(raw, origin, context)
                    if outcome.assembly is not None:
                        prompt, audit = (encode(outcome.assembly.prompt),
                                         encode(outcome.assembly.audit))
                        result: tuple[bytes, bytes] | str = (prompt, audit)
                        request_id = outcome.assembly.prompt.request_id
                        for stream, value in ((prompts_file, prompt), (audits_file, audit)):
                            if stream is not None:
                                stream.write(value + b"\n")
                        if producer is not None:
                            for out in outcome.records:
                                await producer.send(out.topic, out.value, key=out.key,
                                                    headers=list(out.headers))
                    else:
                        rejected = outcome.rejected
                        assert rejected is not None
                        result = f"{rejected.reason}: {rejected.message}"
                        request_id = rejected.request_id or "?"
                        if errors_file is not None:
                            errors_file.write(encode(rejected.record(str(origin), raw)) + b"\n")
                    replayed.append(Replayed((record.partition, record.offset), request_id,
                                             record.timestamp, result))
                    progress.step()
                    if stop.is_set() or (request.count and len(replayed) >= request.count):
                        break
            if producer is not None:
                await producer.commit_transaction()
        except BaseException:
            if producer is not None:
                await producer.abort_transaction()
            raise
        finally:
            progress.close()
            if producer is not None:
                await producer.stop()
        comparisons: list[Comparison] = []
        if request.compare and replayed:
            published = await published_outputs(
                reader, request, {r.coordinates for r in replayed},
                min(r.timestamp_ms for r in replayed))
            comparisons = [
                compare(r.request_id, "{}/{}/{}".format(request.input_topic, *r.coordinates),
                        published.get(r.coordinates), r.result)
                for r in replayed
            ]
    return ReplayReport(replayed, comparisons, stop.is_set())


async def find_recorded(
    bootstrap_servers: str, audit_topic: str, request_id: str, from_ms: int | None
) -> tuple[bytes, bytes, str]:
    """The latest audit published for `request_id`, and the input event it came from."""
    async with TopicReader(bootstrap_servers) as reader:
        spans = await reader.spans(audit_topic, from_ms=from_ms)
        latest = None
        async for record in reader.read(audit_topic, spans):
            if record.key == request_id.encode():
                latest = record
        if latest is None:
            raise LookupError(f"no audit for request {request_id!r} on {audit_topic}")
        headers = list(latest.headers)
        topic, partition, offset = (header(headers, name)
                                    for name in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET))
        if topic is None or partition is None or offset is None:
            raise LookupError(f"the audit of {request_id!r} does not say where its input came from")
        source = (topic.decode(), int(partition), int(offset))
        event = None
        async for record in reader.read(source[0], [Span(source[1], source[2], source[2] + 1)]):
            event = record.value
        if event is None:
            raise LookupError("the input {}/{}/{} is no longer stored".format(*source))
        return event, latest.value, "{}/{}/{}".format(*source)
