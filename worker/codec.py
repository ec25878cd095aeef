"""Bytes in, records out: decoding with limits, and the canonical encoding of outputs.

Kept apart from any I/O so the Kafka worker and the file mode share it byte for byte.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.models import ErrorRecord, RetrievalResult


class Limits(BaseModel):
    """Hostile or broken producers must not be able to exhaust the worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_event_bytes: int = Field(default=4 * 1024 * 1024, ge=1)
    max_chunks: int = Field(default=2000, ge=1)
    max_chunk_chars: int = Field(default=100_000, ge=1)
    max_question_chars: int = Field(default=20_000, ge=1)


class RejectedInput(ValueError):
    """An input that cannot be assembled.

    `reason`: json, schema, limits, policy, budget (the question alone overflows the window)
    or engine (a bug: the event is kept for replay).
    """

    def __init__(self, reason: str, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.request_id = request_id

    def record(self, origin: str, raw: bytes) -> ErrorRecord:
        return ErrorRecord(
            origin=origin,
            reason=self.reason,
            message=self.message,
            request_id=self.request_id,
            raw=raw.decode("utf-8", "replace"),
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


def decode_event(raw: bytes, limits: Limits) -> RetrievalResult:
    if len(raw) > limits.max_event_bytes:
        raise RejectedInput(
            "limits", f"event is {len(raw)} bytes, over max_event_bytes={limits.max_event_bytes}"
        )
    try:
        obj: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise RejectedInput("json", f"not valid UTF-8 JSON: {error}") from None
    request_id = _request_id(obj)
    chunks = obj.get("chunks") if isinstance(obj, dict) else None
    if isinstance(chunks, list) and len(chunks) > limits.max_chunks:
        raise RejectedInput(
            "limits", f"{len(chunks)} chunks, over max_chunks={limits.max_chunks}", request_id
        )
    try:
        event = RetrievalResult.model_validate(obj)
    except ValidationError as error:
        raise RejectedInput("schema", _schema_problems(error), request_id) from None
    if len(event.question) > limits.max_question_chars:
        raise RejectedInput(
            "limits",
            f"question has {len(event.question)} characters, over max_question_chars="
            f"{limits.max_question_chars}",
            request_id,
        )
    for chunk in event.chunks:
        if len(chunk.text) > limits.max_chunk_chars:
            raise RejectedInput(
                "limits",
                f"chunk {chunk.chunk_id!r} has {len(chunk.text)} characters, over "
                f"max_chunk_chars={limits.max_chunk_chars}",
                request_id,
            )
    return event


def encode(record: BaseModel) -> bytes:
    """Field order is the model's; nothing depends on dict iteration of input data."""
    return orjson.dumps(record.model_dump(mode="json"))
