"""What one input record turns into: outputs or a dead letter, as plain data.

Kept free of any Kafka client so the mapping (keys, headers, DLQ format) is unit-tested
without a broker, and both delivery paths (faust, transactional aiokafka) share it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from worker.codec import Limits, RejectedInput, encode
from worker.engine import Assembly
from worker.filemode import assemble_bytes
from worker.policies import PolicyRegistry

Headers = tuple[tuple[str, bytes], ...]
TRACEPARENT = "traceparent"
# Where an output came from: the input's coordinates, as headers (never in the value, so
# the value bytes equal the file mode's).
SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = (
    "context-assembler.source.topic",
    "context-assembler.source.partition",
    "context-assembler.source.offset",
)
# Kafka Connect's dead-letter headers (KIP-298), so existing DLQ tooling can read ours.
ERR = "__connect.errors."


@dataclass(frozen=True, slots=True)
class Origin:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: Headers
    timestamp_ms: int | None

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


@dataclass(frozen=True, slots=True)
class OutRecord:
    topic: str
    key: bytes | None
    value: bytes
    headers: Headers


@dataclass(frozen=True, slots=True)
class Outcome:
    records: tuple[OutRecord, ...]
    assembly: Assembly | None  # None when rejected (or for the benchmark's passthrough)
    rejected: RejectedInput | None


def header(headers: Headers | list[tuple[str, bytes]], name: str) -> bytes | None:
    """The first value of header `name`, or None."""
    return next((value for key, value in headers if key == name), None)


def _stage(reason: str) -> str:
    return "VALUE_CONVERTER" if reason in ("json", "schema", "limits") else "TRANSFORMATION"


def dead_letter(
    origin: Origin, raw: bytes, rejected: RejectedInput, dlq_topic: str, worker: str
) -> OutRecord:
    """The original bytes, key and headers, plus Connect's error headers."""
    error_headers: Headers = (
        (f"{ERR}topic", origin.topic.encode()),
        (f"{ERR}partition", str(origin.partition).encode()),
        (f"{ERR}offset", str(origin.offset).encode()),
        (f"{ERR}connector.name", worker.encode()),
        (f"{ERR}stage", _stage(rejected.reason).encode()),
        (f"{ERR}class.name", b"worker.codec.RejectedInput"),
        (f"{ERR}exception.class.name", f"RejectedInput.{rejected.reason}".encode()),
        (f"{ERR}exception.message", rejected.message.encode()),
    )
    kept = tuple((k, v) for k, v in origin.headers if not k.startswith(ERR))
    return OutRecord(dlq_topic, origin.key, raw, kept + error_headers)


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What every event of one worker (or one replay) is handled with."""

    registry: PolicyRegistry
    limits: Limits
    prompts_topic: str
    audit_topic: str
    dlq_topic: str
    worker: str  # named in dead letters as __connect.errors.connector.name


Handler = Callable[[bytes, Origin, HandlerContext], Outcome]


def handle(raw: bytes, origin: Origin, context: HandlerContext) -> Outcome:
    """Never raises for bad input: a dead letter is an outcome like any other."""
    try:
        assembly = assemble_bytes(raw, context.registry, context.limits)
    except RejectedInput as rejected:
        letter = dead_letter(origin, raw, rejected, context.dlq_topic, context.worker)
        return Outcome((letter,), None, rejected)
    headers: Headers = (
        (SOURCE_TOPIC, origin.topic.encode()),
        (SOURCE_PARTITION, str(origin.partition).encode()),
        (SOURCE_OFFSET, str(origin.offset).encode()),
    )
    trace = header(origin.headers, TRACEPARENT)
    if trace is not None:
        headers += ((TRACEPARENT, trace),)
    key = assembly.prompt.request_id.encode()
    return Outcome(
        (
            OutRecord(context.prompts_topic, key, encode(assembly.prompt), headers),
            OutRecord(context.audit_topic, key, encode(assembly.audit), headers),
        ),
        assembly,
        None,
    )
