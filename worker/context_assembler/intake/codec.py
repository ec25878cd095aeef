"""Bytes in, records out: decoding with limits, and the canonical encoding of outputs.

Kept apart from any I/O so the Kafka worker and the file mode share it byte for byte.
Every byte of an event is untrusted: it must be valid UTF-8 and strict JSON (no repeated
keys, no number that overflows to infinity), and an error record never echoes more than
its first KiB.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from context_assembler.contract.models import (
    AssembledPrompt,
    ErrorRecord,
    KeptChunk,
    RejectReason,
    RetrievalResult,
)
from context_assembler.engine.candidate import brief
from context_assembler.engine.errors import ContextAssemblerError

RAW_KEPT_BYTES: Final = 1024  # of an input, in its error record
MAX_LIMIT: Final = 2**31 - 1
MESSAGE_CHARS: Final = 2048  # of a rejection's message: it may quote untrusted strings


class Limits(BaseModel):
    """Hostile or broken producers must not be able to exhaust the worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Each at most 2^31 - 1 (Kafka's sizes are 32-bit), so that none passes start and then
    # fails every read: a file is read a line at a time in chunks of at most this many bytes.
    max_event_bytes: int = Field(default=4 * 1024 * 1024, ge=1, le=MAX_LIMIT)
    max_chunks: int = Field(default=2000, ge=1, le=MAX_LIMIT)
    max_chunk_chars: int = Field(default=100_000, ge=1, le=MAX_LIMIT)
    max_question_chars: int = Field(default=20_000, ge=1, le=MAX_LIMIT)
    # A kept chunk's id is copied into the drop of each of its copies (`duplicate_of`) and
    # printed as its label: its length bounds what one event's outputs cost per input byte.
    max_chunk_id_chars: int = Field(default=256, ge=1, le=MAX_LIMIT)


@dataclass(frozen=True, slots=True)
class Excerpt:
    """What an error record keeps of an input: its start, its length and its digest.

    The file mode never holds a line over max_event_bytes whole: it reads such a line as an
    Excerpt, which `decode_event` rejects for its length.
    """

    head: bytes  # the first RAW_KEPT_BYTES + 1 bytes (or all, if fewer): enough to cut well
    length: int
    sha256: str  # "sha256:<hex>"

    @classmethod
    def of(cls, raw: bytes) -> Excerpt:
        digest = hashlib.sha256(raw).hexdigest()
        return cls(raw[: RAW_KEPT_BYTES + 1], len(raw), f"sha256:{digest}")


def _utf8_prefix(data: bytes, limit: int) -> bytes:
    """At most `limit` bytes of `data`, not cutting a UTF-8 character in two."""
    if len(data) <= limit:
        return data
    # A character starts at most 3 bytes before any of its continuation bytes (10xxxxxx).
    back = next((i for i in range(4) if data[limit - i] & 0xC0 != 0x80), 0)
    return data[: limit - back]


class RejectedInput(ContextAssemblerError, ValueError):
    """An input that cannot be assembled, and why (`RejectReason`): it becomes an error
    record or a dead letter, and the next input is processed."""

    def __init__(self, reason: RejectReason, message: str, request_id: str | None = None) -> None:
        if len(message) > MESSAGE_CHARS:  # an error record or log line costs a constant
            message = f"{message[:MESSAGE_CHARS]}…"
        super().__init__(message)
        self.reason = RejectReason(reason)  # a string naming no reason fails here, loudly
        self.message = message
        self.request_id = request_id

    def record(self, origin: str, raw: bytes | Excerpt) -> ErrorRecord:
        excerpt = raw if isinstance(raw, Excerpt) else Excerpt.of(raw)
        kept = _utf8_prefix(excerpt.head, RAW_KEPT_BYTES)
        return ErrorRecord(
            origin=origin,
            reason=self.reason,
            message=self.message,
            request_id=self.request_id,
            raw=kept.decode("utf-8", "replace"),
            raw_bytes=excerpt.length,
            raw_truncated=len(kept) < excerpt.length,
            raw_sha256=excerpt.sha256,
        )


def _request_id(obj: object) -> str | None:
    if isinstance(obj, dict):
        value = obj.get("request_id")
        if isinstance(value, str):
            return value
    return None


def _schema_problems(error: ValidationError) -> str:
    shown = [
        f"{'.'.join(str(p) for p in item['loc']) or '<root>'}: {item['msg']}"
        for item in error.errors()[:5]
    ]
    more = error.error_count() - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


def _json_problem(text: str, error: orjson.JSONDecodeError) -> str:
    where = f"line {error.lineno} column {error.colno}"
    if text.startswith(("NaN", "Infinity"), error.pos):  # orjson points past a minus sign
        return f"not valid JSON: NaN and Infinity are not JSON numbers ({where})"
    if error.msg.startswith("number is infinity"):
        return f"not valid JSON: the number at {where} is too large for a double (infinity)"
    return f"not valid JSON: {error}"


def _escapes_a_colon(raw: bytes) -> bool:
    """Whether `raw` may spell a colon as \\u003a; one scan, however many \\u003c (Go's
    encoder writes "<" so) it holds."""
    at = raw.find(b"\\u003")
    while at != -1:
        if raw[at + 5 : at + 6] in (b"a", b"A"):
            return True
        at = raw.find(b"\\u003", at + 5)
    return False


def _may_repeat_keys(raw: bytes, obj: Any) -> bool:
    """Whether an object in `raw` may name a key twice; False is certain.

    Every member of an object in `raw` has one colon outside strings, and orjson keeps one
    member per key. Re-encoded, `obj` holds the colons of its strings literally (orjson
    escapes none), so it holds as many colons as `raw` unless a member was dropped, or a
    string spells a colon as an escape (\\u003a): then the exact check decides. A few scans
    in C instead of a parser three times slower on every event; none but a comparison
    when `raw` is byte for byte what orjson writes of `obj`.
    """
    try:
        again = orjson.dumps(obj)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes (254 levels)
        return True
    if again == raw:  # written as orjson writes (our own outputs, compact producers): its
        return False  # objects are dicts written out again, one member per key
    if _escapes_a_colon(raw):
        return True
    return _colons(raw) != _colons(again)


def _colons(data: bytes) -> int:
    """How many b":" `data` holds: replace runs at memchr speed, bytes.count of one byte
    several times slower (7 against 40 us on a 51 KB event)."""
    return len(data) - len(data.replace(b":", b""))


class _Members(list[tuple[str, Any]]):
    """An object's members in order, repeats included."""


def _path(parent: str, key: str | int) -> str:
    """Where a value is, as in chunks[3].metadata (or ['odd key'] for a key no identifier)."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if key.isidentifier():
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{key!r}]"


def _repeated_key(text: str) -> tuple[str, str] | None:
    """The first repeated key (objects in document order) and the path of its object."""
    try:
        tree = json.loads(text, object_pairs_hook=_Members)
    except RecursionError:
        raise RejectedInput(
            RejectReason.JSON, "nested too deeply to check for repeated keys"
        ) from None
    stack: list[tuple[str, Any]] = [("", tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Members):
            seen: set[str] = set()
            for key, _ in node:
                if key in seen:
                    return key, path
                seen.add(key)
            stack.extend((_path(path, key), value) for key, value in reversed(node))
        elif isinstance(node, list):
            stack.extend((_path(path, i), value) for i, value in reversed(list(enumerate(node))))
    return None


def _parse(raw: bytes) -> Any:
    """orjson's parse of `raw`, after checking what orjson would let through or blur.

    orjson refuses invalid UTF-8 too, so `raw` is decoded to text only to explain a refusal
    or find a repeated key (decoding a 2.6 MB event first took 0.2 ms)."""
    try:
        obj: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise RejectedInput(RejectReason.JSON, _json_problem(_text(raw), error)) from None
    if _may_repeat_keys(raw, obj) and (repeated := _repeated_key(_text(raw))):
        key, path = repeated
        # Of two request_ids, neither is the event's.
        request_id = None if (key, path) == ("request_id", "") else _request_id(obj)
        raise RejectedInput(
            RejectReason.JSON, f"duplicate key {key!r} in {path or 'the event'}", request_id
        )
    return obj


# For the other records the shells read (the citation check's).
parse_json = _parse
schema_problems = _schema_problems


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RejectedInput(
            RejectReason.JSON, f"not valid UTF-8 at byte {error.start}"
        ) from None


def _over_limit(length: int, limits: Limits) -> RejectedInput:
    return RejectedInput(
        RejectReason.LIMITS,
        f"event is {length} bytes, over max_event_bytes={limits.max_event_bytes}",
    )


def _too_long(
    what: str, length: int, limit: str, most: int, request_id: str | None
) -> RejectedInput:
    return RejectedInput(
        RejectReason.LIMITS, f"{what} has {length} characters, over {limit}={most}", request_id
    )


# Checks a decoded event against a schema of its own (a framed record's registered JSON
# Schema), given its request_id; raises a RejectedInput.
Check = Callable[[Any, str | None], None]


def decode_event(
    raw: bytes | Excerpt, limits: Limits, check: Check | None = None
) -> RetrievalResult:
    if isinstance(raw, Excerpt):
        raise _over_limit(raw.length, limits)
    if len(raw) > limits.max_event_bytes:
        raise _over_limit(len(raw), limits)
    obj = _parse(raw)
    request_id = _request_id(obj)
    chunks = obj.get("chunks") if isinstance(obj, dict) else None
    if isinstance(chunks, list) and len(chunks) > limits.max_chunks:
        raise RejectedInput(
            RejectReason.LIMITS,
            f"{len(chunks)} chunks, over max_chunks={limits.max_chunks}",
            request_id,
        )
    if check is not None:
        check(obj, request_id)
    try:
        event = RetrievalResult.model_validate(obj)
    except ValidationError as error:
        raise RejectedInput(RejectReason.SCHEMA, _schema_problems(error), request_id) from None
    if len(event.question) > limits.max_question_chars:
        raise _too_long("question", len(event.question), "max_question_chars",
                        limits.max_question_chars, request_id)
    for index, chunk in enumerate(event.chunks):
        if len(chunk.chunk_id) > limits.max_chunk_id_chars:
            raise _too_long(f"chunks[{index}].chunk_id", len(chunk.chunk_id),
                            "max_chunk_id_chars", limits.max_chunk_id_chars, request_id)
        if len(chunk.text) > limits.max_chunk_chars:
            raise _too_long(f"chunk {brief(chunk.chunk_id)!r}", len(chunk.text),
                            "max_chunk_chars", limits.max_chunk_chars, request_id)
    return event


# The optional fields the contract gained, left out when absent, as the models' serializers
# leave them out: records without them keep the bytes they had before the fields existed.
_ABSENT_WHEN_NONE: dict[type[BaseModel], str] = {
    AssembledPrompt: "provider_request",
    KeptChunk: "sentences",
}


def _fields(value: object) -> dict[str, Any]:
    """A model's fields in declaration order, for orjson to write (it writes dates, enums,
    floats and containers as pydantic's JSON mode does); anything else is a bug."""
    if isinstance(value, BaseModel):
        optional = _ABSENT_WHEN_NONE.get(type(value))
        if optional is not None and getattr(value, optional) is None:
            return {k: v for k, v in value.__dict__.items() if k != optional}
        return value.__dict__
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode(record: BaseModel) -> bytes:
    """Field order is the model's; nothing depends on dict iteration of input data.

    orjson walks the models itself (`_fields`): the same bytes as
    `orjson.dumps(record.model_dump(mode="json"))` in a quarter of the time, since our
    models have no aliases or computed fields, and `_fields` does what the one serializer
    (AssembledPrompt's) does.
    """
    return orjson.dumps(record, default=_fields)


# In UTF-8, what JSON may carry raw but no terminal should receive: DEL, the C1 controls
# (U+0085 and U+009B, CSI, among them), the bidi controls and the line and paragraph
# separators (diagnose.explain.printable escapes the same set in lines shown to people).
_UNSHOWABLE = re.compile(
    rb"\x7f|\xc2[\x80-\x9f]|\xd8\x9c|\xe2\x80[\x8e\x8f\xa8-\xae]|\xe2\x81[\xa6-\xa9]")


def encode_error_record(record: ErrorRecord) -> bytes:
    """`encode`, with what a terminal would act on written as JSON escapes (the same string
    to a JSON reader): error records go to stderr by default, and they quote the input."""
    return _UNSHOWABLE.sub(
        lambda found: b"\\u%04x" % ord(found.group().decode()), encode(record))
