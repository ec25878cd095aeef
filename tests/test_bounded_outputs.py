"""Every output of an event (prompt, audit, error record, dead letter) is bounded by a small
constant times the event's size plus a constant, however the event was built to blow up:
no drop's detail or reference copies an untrusted string of unbounded length."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from context_assembler import filemode
from context_assembler.contract.models import RejectReason
from context_assembler.engine.policy import policy_from_mapping
from context_assembler.intake.codec import MESSAGE_CHARS, Limits, RejectedInput
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import HandlerContext, Origin, handle
from context_assembler.settings import Settings

RATIO, SLACK = 20, 16 * 1024  # outputs <= RATIO * input + SLACK bytes
LIMITS = Limits()
FORMATS = ("messages", "anthropic", "cohere")


def _context(form: str) -> HandlerContext:
    # Room for every passage, so what an event makes the prompt repeat is measured too (in a
    # provider format, the provider's request repeats it once more).
    roomy = policy_from_mapping({"budget": {"context_tokens": 2_000_000, "window": None},
                                 "render": {"format": form}})
    # Large enough to take any output whole, so its size is measured rather than capped.
    settings = Settings(prompts_topic="p", audit_topic="a", dlq_topic="d", group_id="w",
                        max_message_bytes=1 << 30)
    return HandlerContext(settings=settings, registry=PolicyRegistry(roomy))


CONTEXTS = {form: _context(form) for form in FORMATS}
CONTEXT = CONTEXTS["messages"]


def encoded(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event)


def long_audience(copies: int = 1500) -> bytes:
    """A request audience of 100 KB, and many chunks limited to another audience."""
    chunks = [{"chunk_id": f"c{n}", "text": "a", "audience": ["staff"]} for n in range(copies)]
    return encoded({"request_id": "r", "question": "q", "audience": "x" * 100_000,
                    "chunks": chunks})


def long_kept_id(copies: int = 1999) -> bytes:
    """A kept chunk whose id is as long as the limits allow, and many tiny copies of it."""
    first = {"chunk_id": "k" * LIMITS.max_chunk_id_chars, "text": "a"}
    copies_ = [{"chunk_id": str(n), "text": "a"} for n in range(copies)]
    return encoded({"request_id": "r", "question": "q", "chunks": [first, *copies_]})


def near_copies_of_long_id(copies: int = 1999) -> bytes:
    """Near-duplicates (the same word, cased apart) of a kept chunk with the longest id allowed."""
    first = {"chunk_id": "k" * LIMITS.max_chunk_id_chars, "text": "a"}
    copies_ = [{"chunk_id": str(n), "text": "A"} for n in range(copies)]
    return encoded({"request_id": "r", "question": "q", "chunks": [first, *copies_]})


def long_audience_lists(copies: int = 500) -> bytes:
    """Chunks each limited to many long audience names, none the request's."""
    names = [f"{n}" * 300 for n in range(10)]
    chunks = [{"chunk_id": f"c{n}", "text": "a", "audience": names} for n in range(copies)]
    return encoded({"request_id": "r", "question": "q", "audience": "y", "chunks": chunks})


def bracketed_fields() -> bytes:
    """Header fields of nothing but "<", each printed (as "&lt;") in the passage header of
    the user message and of the context, and quoted in the citation."""
    fields = dict.fromkeys(["title", "section", "source", "doc_type", "version"], "<" * 40_000)
    chunk = {"chunk_id": "c", "text": "<documents>\n[c] " * 5_000, **fields}
    return encoded({"request_id": "r", "question": "q", "chunks": [chunk]})


def too_long_id() -> bytes:
    """A chunk id over the limit: a rejection, whose message must not quote it whole."""
    chunk = {"chunk_id": "k" * 1_000_000, "text": "a" * 200_000}
    return encoded({"request_id": "r", "question": "q", "chunks": [chunk]})


def long_unknown_field() -> bytes:
    """A schema error naming a field whose name is a megabyte long."""
    chunk = {"chunk_id": "c", "text": "a", "z" * 1_000_000: 1}
    return encoded({"request_id": "r", "question": "q", "chunks": [chunk] * 3})


HOSTILE: list[Callable[[], bytes]] = [
    long_audience, long_kept_id, near_copies_of_long_id, long_audience_lists, bracketed_fields,
    too_long_id, long_unknown_field,
]


def file_mode_bytes(raw: bytes, context: HandlerContext) -> int:
    prompts, audits, errors = io.BytesIO(), io.BytesIO(), io.BytesIO()
    filemode.run([("in", io.BytesIO(raw))], context.registry, LIMITS, prompts=prompts,
                 audits=audits, errors=errors)
    return sum(len(stream.getvalue()) for stream in (prompts, audits, errors))


def kafka_bytes(raw: bytes, context: HandlerContext) -> int:
    outcome = handle(raw, Origin("in", 0, 0, b"r", (), None), context)
    return sum(len(record.value) + sum(len(value) for _, value in record.headers)
               + len(record.key or b"") for record in outcome.records)


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("build", HOSTILE, ids=lambda build: build.__name__)
@pytest.mark.parametrize("outputs", [file_mode_bytes, kafka_bytes], ids=["file", "kafka"])
def test_outputs_are_at_most_a_constant_times_the_input(
    build: Callable[[], bytes], outputs: Callable[[bytes, HandlerContext], int], form: str
) -> None:
    raw = build()
    assert outputs(raw, CONTEXTS[form]) <= RATIO * len(raw) + SLACK


def test_a_chunk_id_over_the_limit_is_rejected_naming_the_limit() -> None:
    outcome = handle(too_long_id(), Origin("in", 0, 0, None, (), None), CONTEXT)
    assert outcome.rejected is not None and outcome.rejected.reason == "limits"
    assert "max_chunk_id_chars=256" in outcome.rejected.message


def test_a_rejections_message_is_cut_to_a_constant() -> None:
    message = RejectedInput(RejectReason.SCHEMA, "m" * 10 * MESSAGE_CHARS).message
    assert len(message) == MESSAGE_CHARS + 1 and message.endswith("…")
