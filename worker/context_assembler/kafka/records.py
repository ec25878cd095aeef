"""What one input record turns into: outputs or a dead letter, as plain data.

Kept free of any Kafka client so the mapping (keys, headers, DLQ format) and the size
decisions are unit-tested without a broker, and both delivery paths (faust, transactional
aiokafka) share it.

Every record is sized before it is sent, as the producer will size it: a record over
max_message_bytes would be refused, and retried forever. So an output that would not fit
turns its event into an `output_too_large` dead letter, and a dead letter that would not fit
(the original value plus the error headers) is cut to fit, with headers saying so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from context_assembler.contract.models import RejectReason
from context_assembler.engine import Assembly
from context_assembler.intake.codec import Check, Limits, RejectedInput, encode
from context_assembler.intake.framing import Resolved, UnknownSchema, frame, split
from context_assembler.intake.handle import assemble_bytes
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.observability.traceparent import valid_traceparent_header
from context_assembler.settings import Settings

Headers = tuple[tuple[str, bytes], ...]
# As clients hand them out: aiokafka a sequence of pairs, a null value as None; faust passes
# aiokafka's on, and its own type allows a mapping.
RecordHeaders = Sequence[tuple[str, bytes | None]] | Mapping[str, bytes | None]
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
# On a dead letter whose value was cut to fit: the whole value's length and digest.
TRUNCATED, ORIGINAL_BYTES, ORIGINAL_SHA256 = (
    "context-assembler.truncated",
    "context-assembler.original.bytes",
    "context-assembler.original.sha256",
)
_CUT_HEADERS = (TRUNCATED, ORIGINAL_BYTES, ORIGINAL_SHA256)  # an input's own are dropped
MESSAGE_KEPT_BYTES = 1024  # of the exception message, when even the headers must be cut
# A v2 record batch header (61 bytes) and a record's worst-case attributes and varints (21):
# aiokafka's own estimate, which it compares with max_request_size.
_BATCH_OVERHEAD = 61 + 21


class ConsumedRecord(Protocol):
    """A record as a consumer hands it out: faust's Message and aiokafka's ConsumerRecord.

    `timestamp`: faust's is in seconds, a float (aiokafka's milliseconds / 1000.0);
    aiokafka's is in milliseconds, an int.
    """

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> RecordHeaders | None: ...
    @property
    def timestamp(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an input event came from: its coordinates, key, headers and timestamp."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: Headers
    timestamp_ms: int | None

    @classmethod
    def from_record(cls, record: ConsumedRecord) -> Origin:
        """The origin of a consumed record, faust's or aiokafka's alike: headers as
        (str, bytes) pairs in their order (a null value as b""), the timestamp in ms."""
        return cls(
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
            headers=_headers(record.headers),
            timestamp_ms=_milliseconds(record.timestamp),
        )

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


def value_of(record: ConsumedRecord) -> bytes:
    """A consumed record's value (a `SkippedBatch` as it is); a tombstone's (None) is empty."""
    return b"" if record.value is None else record.value


class SkippedBatch(bytes):
    """The value of the one record a consumer reads of a compressed record batch that would
    decompress beyond max_batch_bytes (kafka.batches): empty, never off the wire (a value
    read is plain bytes), naming the batch's offsets and why it was skipped unread."""

    def __new__(cls, **_: object) -> SkippedBatch:
        return super().__new__(cls, b"")

    def __init__(self, *, first_offset: int, last_offset: int, codec: str,
                 compressed_bytes: int, limit: int, declared: int | None) -> None:
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.codec = codec
        self.compressed_bytes = compressed_bytes
        self.limit = limit
        self.declared = declared

    @property
    def message(self) -> str:
        offsets = (f"offset {self.last_offset}" if self.first_offset == self.last_offset
                   else f"offsets {self.first_offset}-{self.last_offset}")
        over = (f"declares {self.declared} bytes" if self.declared is not None
                else "decompresses to more")
        return (f"record batch at {offsets} ({self.codec}, {self.compressed_bytes} bytes "
                f"compressed) {over}, over max_batch_bytes={self.limit}: skipped unread")


def _headers(headers: RecordHeaders | None) -> Headers:
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return tuple((name, b"" if value is None else bytes(value)) for name, value in pairs)


def _milliseconds(timestamp: float | None) -> int | None:
    """aiokafka's int milliseconds as they are; faust's float seconds (milliseconds / 1000.0)
    back to the milliseconds they were made from: `round`, since int() comes back 1 ms short
    for some (in 2004 and in 2038-39, none in between)."""
    if timestamp is None or isinstance(timestamp, int):
        return timestamp
    return round(timestamp * 1000)


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


def header(headers: Iterable[tuple[str, bytes]], name: str) -> bytes | None:
    """The first value of header `name`, or None."""
    return next((value for key, value in headers if key == name), None)


def _varint_bytes(length: int) -> int:
    """Bytes of a length as Kafka writes it: a zigzag varint."""
    zigzag, size = length << 1, 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def _field_bytes(data: bytes | None) -> int:
    return 1 if data is None else _varint_bytes(len(data)) + len(data)


def record_size(record: OutRecord) -> int:
    """Bytes `record` takes alone in a record batch: what the producer compares with its
    max_request_size, and at least what the broker compares with max.message.bytes."""
    size = _BATCH_OVERHEAD + _field_bytes(record.key) + _field_bytes(record.value)
    size += _varint_bytes(len(record.headers))
    for name, value in record.headers:
        size += _field_bytes(name.encode()) + _field_bytes(value)
    return size


def _stage(reason: str) -> str:
    if reason in ("json", "schema", "limits"):
        return "VALUE_CONVERTER"
    return "KAFKA_PRODUCE" if reason == "output_too_large" else "TRANSFORMATION"


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
        (f"{ERR}class.name", b"context_assembler.intake.codec.RejectedInput"),
        (f"{ERR}exception.class.name", f"RejectedInput.{rejected.reason}".encode()),
        (f"{ERR}exception.message", rejected.message.encode()),
    )
    kept = tuple(
        (k, v) for k, v in origin.headers if not k.startswith(ERR) and k not in _CUT_HEADERS
    )
    return OutRecord(dlq_topic, origin.key, raw, kept + error_headers)


def cut(letter: OutRecord, limit: int) -> OutRecord:
    """`letter` if it fits in `limit` bytes, else a copy that does, keeping the value's first
    bytes and, in headers, the whole value's length and sha256.

    If the key and headers alone leave no room, the input's own headers go and the error
    message is capped; if that is not enough either, the key goes too.
    """
    if record_size(letter) <= limit:
        return letter
    value = letter.value
    marks: Headers = (
        (TRUNCATED, b"true"),
        (ORIGINAL_BYTES, str(len(value)).encode()),
        (ORIGINAL_SHA256, hashlib.sha256(value).hexdigest().encode()),
    )
    errors = tuple((k, v) for k, v in letter.headers if k.startswith(ERR))
    inputs = tuple((k, v) for k, v in letter.headers if not k.startswith(ERR))
    capped = tuple(
        (k, _utf8_prefix(v, MESSAGE_KEPT_BYTES) if k == f"{ERR}exception.message" else v)
        for k, v in errors
    )
    for key, headers in ((letter.key, inputs + errors), (letter.key, capped), (None, capped)):
        shell = OutRecord(letter.topic, key, b"", headers + marks)
        # The empty value takes one byte (its length); a longer one's, at most that of `limit`.
        room = limit - record_size(shell) + 1 - _varint_bytes(limit)
        if room >= 0:
            return OutRecord(letter.topic, key, value[:room], shell.headers)
    return OutRecord(letter.topic, None, b"", shell.headers)  # refused: retried, reported


def _utf8_prefix(data: bytes, limit: int) -> bytes:
    """At most `limit` bytes of UTF-8 `data`, not cutting a character in two."""
    return data[:limit].decode("utf-8", "ignore").encode()


@dataclass(frozen=True, slots=True, kw_only=True)
class HandlerContext:
    """What every event of one worker (or one replay) is handled with: the settings' topics,
    limits and largest record (dead letters name its group), under `registry`'s policies."""

    settings: Settings
    registry: PolicyRegistry
    # With a schema registry: the schemas of the ids the events handled name (None: no
    # registry, so a framed event is rejected), and the ids the outputs are framed with.
    schemas: Mapping[int, Resolved] | None = None
    prompt_schema_id: int | None = None
    audit_schema_id: int | None = None
    # The settings' limits, built once here rather than once an event.
    limits: Limits = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", self.settings.limits)


Handler = Callable[[bytes, Origin, HandlerContext], Outcome]


def fit(
    outcome: Outcome,
    raw: bytes,
    origin: Origin,
    context: HandlerContext,
    limits: Mapping[str, int] | None = None,
) -> Outcome:
    """`outcome` with every record within its topic's limit: max_message_bytes, or less
    where `limits` says a topic refused less. An output over it makes the event an
    `output_too_large` dead letter (none of its outputs is sent). A dead letter is built
    afresh from `raw` and cut to fit, so its headers always describe the original value."""
    learned = limits or {}
    largest = context.settings.max_message_bytes

    def limit(topic: str) -> int:
        return min(largest, learned.get(topic, largest))

    rejected = outcome.rejected
    if rejected is None:
        for record in outcome.records:
            size = record_size(record)
            if size > limit(record.topic):
                request_id = outcome.assembly.prompt.request_id if outcome.assembly else None
                rejected = RejectedInput(
                    RejectReason.OUTPUT_TOO_LARGE,
                    f"its record for {record.topic} would be {size} bytes, over the "
                    f"{limit(record.topic)} a message may have",
                    request_id,
                )
                break
        else:
            return outcome
    dlq_topic = context.settings.dlq_topic
    letter = dead_letter(origin, raw, rejected, dlq_topic, context.settings.group_id)
    return Outcome((cut(letter, limit(dlq_topic)),), None, rejected)


def _unframed(raw: bytes, context: HandlerContext) -> tuple[bytes, Check | None]:
    """An event's JSON, and the check of its registered schema if it is framed."""
    schema_id, payload = split(raw)
    if schema_id is None:
        return raw, None
    if context.schemas is None:
        raise RejectedInput(RejectReason.SCHEMA, f"framed with schema id {schema_id}, but no "
                            "schema registry is set (ASSEMBLER_SCHEMA_REGISTRY_URL)")
    schema = context.schemas.get(schema_id) or UnknownSchema(schema_id, "not looked up")
    if isinstance(schema, UnknownSchema):
        raise schema.rejection()
    return payload, schema.check


def _framed(schema_id: int | None, payload: bytes) -> bytes:
    return payload if schema_id is None else frame(schema_id, payload)


def handle(raw: bytes, origin: Origin, context: HandlerContext) -> Outcome:
    """Never raises for bad input: a dead letter is an outcome like any other. A framed
    event is assembled from its JSON, checked against its schema first; the outputs are
    framed with their own ids when the context has them."""
    if isinstance(raw, SkippedBatch):
        rejected = RejectedInput(RejectReason.LIMITS, raw.message)
        return fit(Outcome((), None, rejected), b"", origin, context)
    try:
        payload, check = _unframed(raw, context)
        assembly = assemble_bytes(payload, context.registry, context.limits, check)
    except RejectedInput as rejected:
        # Without its traceback: its frames hold `raw` and, through their callers, the
        # outcomes that hold it back, a cycle only the garbage collector would free.
        return fit(Outcome((), None, rejected.with_traceback(None)), raw, origin, context)
    headers: Headers = (
        (SOURCE_TOPIC, origin.topic.encode()),
        (SOURCE_PARTITION, str(origin.partition).encode()),
        (SOURCE_OFFSET, str(origin.offset).encode()),
    )
    trace = header(origin.headers, TRACEPARENT)
    if trace is not None and valid_traceparent_header(trace):  # as serve: never a forged one
        headers += ((TRACEPARENT, trace),)
    key = assembly.prompt.request_id.encode()
    outputs = (
        OutRecord(context.settings.prompts_topic, key,
                  _framed(context.prompt_schema_id, encode(assembly.prompt)), headers),
        OutRecord(context.settings.audit_topic, key,
                  _framed(context.audit_schema_id, encode(assembly.audit)), headers),
    )
    return fit(Outcome(outputs, assembly, None), raw, origin, context)
