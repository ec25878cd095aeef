"""The record mapping both delivery paths share, without a broker."""

import hashlib
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from aiokafka.structs import ConsumerRecord

from context_assembler.contract.models import RejectReason, RetrievalResult
from context_assembler.engine import assemble
from context_assembler.engine.policy import Policy
from context_assembler.intake.codec import Limits, RejectedInput, encode
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import (
    ERR,
    MESSAGE_KEPT_BYTES,
    ORIGINAL_BYTES,
    ORIGINAL_SHA256,
    TRUNCATED,
    HandlerContext,
    Origin,
    Outcome,
    OutRecord,
    cut,
    dead_letter,
    fit,
    handle,
    record_size,
    value_of,
)
from context_assembler.settings import DEFAULT_MAX_MESSAGE_BYTES, MIN_MESSAGE_BYTES, Settings
from tests.factories import EXAMPLES

CONTEXT = HandlerContext(settings=Settings(prompts_topic="prompts", audit_topic="audit",
                                           dlq_topic="dlq", group_id="context-assembler"),
                         registry=PolicyRegistry(Policy()))
GOOD = (EXAMPLES / "events.jsonl").read_bytes().splitlines()[0]


def origin(headers: tuple[tuple[str, bytes], ...] = ()) -> Origin:
    return Origin("retrieval.results", 2, 41, b"q30-staff", headers, 1_700_000_000_000)


def run(raw: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> Outcome:
    return handle(raw, origin(headers), CONTEXT)


TRACE = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # W3C's own example


def test_a_good_event_gives_a_prompt_and_an_audit_with_the_file_modes_bytes() -> None:
    outcome = run(GOOD, (("traceparent", TRACE), ("other", b"x")))
    prompt, audit = outcome.records
    expected = assemble(RetrievalResult.model_validate_json(GOOD), Policy())
    assert (prompt.topic, audit.topic) == ("prompts", "audit")
    assert prompt.value == encode(expected.prompt) and audit.value == encode(expected.audit)
    assert prompt.key == audit.key == b"q30-staff"
    headers = dict(prompt.headers)
    assert headers["traceparent"] == TRACE
    assert headers["context-assembler.source.partition"] == b"2"
    assert headers["context-assembler.source.offset"] == b"41"
    assert "other" not in headers  # only the trace context is propagated


def test_a_bad_event_becomes_one_dead_letter_in_kafka_connects_format() -> None:
    raw = b'{"request_id": "r1", "chunks": 3}'
    outcome = run(raw, (("traceparent", b"t"), (f"{ERR}topic", b"stale")))
    assert outcome.assembly is None and outcome.rejected is not None
    (letter,) = outcome.records
    assert (letter.topic, letter.key, letter.value) == ("dlq", b"q30-staff", raw)
    headers = dict(letter.headers)
    assert headers[f"{ERR}topic"] == b"retrieval.results"  # the stale copy was replaced
    assert headers[f"{ERR}partition"] == b"2" and headers[f"{ERR}offset"] == b"41"
    assert headers[f"{ERR}stage"] == b"VALUE_CONVERTER"
    assert headers[f"{ERR}exception.class.name"] == b"RejectedInput.schema"
    assert b"question" in headers[f"{ERR}exception.message"]
    assert headers["traceparent"] == b"t"


@pytest.mark.parametrize("forged", [
    b"00-abc-def-01", b"t", b"\x1b[2J", b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    b"00-00000000000000000000000000000000-b7ad6b7169203331-01",
    b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
    b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", TRACE + b" ", TRACE * 100,
    b"\xff" + TRACE[1:],
])
def test_an_invalid_traceparent_is_not_copied_onto_the_outputs(forged: bytes) -> None:
    for record in run(GOOD, (("traceparent", forged),)).records:
        assert "traceparent" not in dict(record.headers)


def test_an_unknown_policy_is_a_transformation_error() -> None:
    raw = orjson.dumps({"request_id": "r2", "question": "q", "policy": "nope"})
    (letter,) = run(raw).records
    assert dict(letter.headers)[f"{ERR}stage"] == b"TRANSFORMATION"


def test_the_dead_letter_headers_are_the_ones_the_asyncapi_file_lists() -> None:
    from context_assembler.generate.schemas import DEAD_LETTER_HEADERS

    (letter,) = run(b"{bad").records
    assert [k.removeprefix(ERR) for k, _ in letter.headers if k.startswith(ERR)] == DEAD_LETTER_HEADERS


def test_the_output_headers_are_the_ones_the_asyncapi_file_lists() -> None:
    from context_assembler.generate.schemas import asyncapi

    messages = asyncapi()["components"]["messages"]
    for traced in (False, True):
        headers = (("traceparent", TRACE),) if traced else ()
        for record, name in zip(run(GOOD, headers).records,
                                ("assembled-prompt", "assembly-audit"), strict=True):
            described = messages[name]["headers"]
            sent = [key for key, _ in record.headers]
            assert set(sent) <= set(described["properties"]), name
            assert set(described["required"]) <= set(sent), name
            assert ("traceparent" in sent) is traced
            key = messages[name]["bindings"]["kafka"]["key"]
            assert key["description"].startswith("The request_id")
            assert record.key == b"q30-staff"


# Sizes: every record is sized as the producer sizes it, and kept within max_message_bytes.

def test_record_size_is_the_producers_own_estimate() -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    for key in (None, b"", b"k" * 200):
        for length in (0, 1, 63, 64, 8191, 8192, 1_048_576):
            for headers in ((), (("a", b"x"), ("traceparent", b"t" * 300))):
                record = OutRecord("t", key, b"v" * length, headers)
                expected = DefaultRecordBatchBuilder.estimate_size_in_bytes(
                    key, record.value, list(headers))
                assert record_size(record) == expected


def context(max_message_bytes: int) -> HandlerContext:
    """CONTEXT with records up to `max_message_bytes`, below what an operator may set."""
    settings = CONTEXT.settings.model_copy(update={"max_message_bytes": max_message_bytes})
    return replace(CONTEXT, settings=settings)


def test_an_output_over_max_message_bytes_makes_the_event_an_output_too_large_dead_letter() -> None:
    prompt, _audit = run(GOOD).records
    outcome = handle(GOOD, origin(), context(record_size(prompt) - 1))
    assert outcome.assembly is None and outcome.rejected is not None
    assert outcome.rejected.reason == "output_too_large"
    assert outcome.rejected.request_id == "q30-staff"
    (letter,) = outcome.records  # no output is left as the only answer
    assert (letter.topic, letter.key, letter.value) == ("dlq", b"q30-staff", GOOD)
    headers = dict(letter.headers)
    assert headers[f"{ERR}exception.class.name"] == b"RejectedInput.output_too_large"
    assert headers[f"{ERR}stage"] == b"KAFKA_PRODUCE"
    assert f"for prompts would be {record_size(prompt)} bytes".encode() in headers[
        f"{ERR}exception.message"]
    assert TRUNCATED not in headers


def test_outputs_that_fit_exactly_are_sent() -> None:
    prompt, audit = run(GOOD).records
    assert handle(GOOD, origin(), context(record_size(prompt))).records == (prompt, audit)


def huge_rejected(size: int) -> bytes:
    """A schema-invalid event (no question) of `size` bytes."""
    head, tail = b'{"request_id": "huge", "padding": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def test_a_dead_letter_over_the_limit_is_cut_to_fit_with_its_original_length_and_digest() -> None:
    raw = huge_rejected(1_048_400)
    headers = (("traceparent", b"00-abc-def-01"),)
    outcome = handle(raw, origin(headers), CONTEXT)
    (letter,) = outcome.records
    assert outcome.rejected is not None and outcome.rejected.reason == "schema"
    size = record_size(letter)
    assert DEFAULT_MAX_MESSAGE_BYTES - 4 <= size <= DEFAULT_MAX_MESSAGE_BYTES  # cut, tightly
    assert raw.startswith(letter.value) and len(letter.value) < len(raw)
    assert letter.key == b"q30-staff"  # the original key and headers are kept
    found = dict(letter.headers)
    assert found["traceparent"] == b"00-abc-def-01"
    assert found[TRUNCATED] == b"true"
    assert found[ORIGINAL_BYTES] == b"1048400"
    assert found[ORIGINAL_SHA256] == hashlib.sha256(raw).hexdigest().encode()
    assert found[f"{ERR}exception.class.name"] == b"RejectedInput.schema"
    assert found[f"{ERR}offset"] == b"41"
    assert handle(raw, origin(headers), CONTEXT).records == outcome.records  # same bytes, always


def test_a_dead_letter_that_fits_is_sent_whole() -> None:
    raw = huge_rejected(1_000_000)
    (letter,) = run(raw).records
    assert letter.value == raw and TRUNCATED not in dict(letter.headers)


def test_an_inputs_own_truncation_headers_never_reach_the_dead_letter() -> None:
    forged = ((TRUNCATED, b"true"), (ORIGINAL_SHA256, b"forged"), ("other", b"kept"))
    (letter,) = run(b"{bad", forged).records
    assert [k for k, _ in letter.headers if not k.startswith(ERR)] == ["other"]


def test_when_key_and_headers_leave_no_room_they_are_cut_too() -> None:
    limit = 20_000
    many = tuple((f"h{n}", b"x" * 1000) for n in range(30))
    message = "policy " + "é" * 20_000  # a hostile policy name echoed in the message
    rejected = RejectedInput(RejectReason.POLICY, message, "r")
    letter = dead_letter(origin(many), b"{}", rejected, "dlq", "w")
    small = cut(letter, limit)
    assert record_size(small) <= limit
    assert small.key == b"q30-staff" and not any(k.startswith("h") for k, _ in small.headers)
    kept = dict(small.headers)[f"{ERR}exception.message"]
    assert len(kept) <= MESSAGE_KEPT_BYTES and kept.decode().startswith("policy éé")
    assert dict(small.headers)[ORIGINAL_BYTES] == b"2" and small.value == b"{}"

    keyed = Origin("in", 0, 7, b"k" * 30_000, (), None)
    bare = cut(dead_letter(keyed, b"{}", rejected, "dlq", "w"), limit)
    assert record_size(bare) <= limit and bare.key is None


def test_limits_learned_for_a_topic_apply_to_its_records_only() -> None:
    prompt, audit = run(GOOD).records
    assert fit(run(GOOD), GOOD, origin(), CONTEXT, {"audit": record_size(audit)}).records == (
        prompt, audit)
    refitted = fit(run(GOOD), GOOD, origin(), CONTEXT, {"audit": record_size(audit) - 1})
    assert refitted.rejected is not None and refitted.rejected.reason == "output_too_large"
    raw = huge_rejected(100_000)
    (letter,) = fit(run(raw), raw, origin(), CONTEXT, {"dlq": MIN_MESSAGE_BYTES}).records
    assert record_size(letter) <= MIN_MESSAGE_BYTES and dict(letter.headers)[TRUNCATED] == b"true"


def test_the_smallest_max_message_bytes_setting_still_fits_a_dead_letter() -> None:
    from context_assembler.settings import Settings

    assert Settings.model_fields["max_message_bytes"].metadata[0].ge == MIN_MESSAGE_BYTES
    assert Settings().max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES


# One way in: Origin.from_record takes faust's records and aiokafka's alike.

def consumed(
    timestamp: int | None = 1_700_000_000_123,
    headers: list[tuple[str, bytes | None]] | None = None,
    value: bytes | None = b"{}",
) -> ConsumerRecord[bytes, bytes]:
    """A record as aiokafka's consumer hands it out."""
    return ConsumerRecord(
        topic="retrieval.results", partition=2, offset=41, timestamp=timestamp,
        timestamp_type=0, key=b"q30-staff", value=value, checksum=None,
        serialized_key_size=9, serialized_value_size=2,
        headers=headers if headers is not None else [("traceparent", b"00-abc-def-01")],
    )


def as_faust(record: ConsumerRecord[bytes, bytes]) -> Any:
    """The same record as faust's agent sees it: converted by faust's own consumer code."""
    from faust.transport.drivers.aiokafka import Consumer

    consumer: Any = SimpleNamespace(app=SimpleNamespace(consumer_generation_id=1))
    tp: Any = (record.topic, record.partition)
    return Consumer._to_message(consumer, tp, record)


# faust divides milliseconds by 1000.0; int(seconds * 1000) is 1 ms short for these (1970,
# 2038 and 2039; none from November 2004 to 2038), and faust's own send truncates that way.
AWKWARD_MS = [262_757_583, 527_468_428, 2_147_504_927_082, 2_198_951_015_108]
STAMPS = [*AWKWARD_MS, 1_700_000_000_123, 0, 1, -1]


def test_an_aiokafka_record_and_its_faust_message_give_one_origin() -> None:
    record = consumed()
    expected = Origin("retrieval.results", 2, 41, b"q30-staff",
                      (("traceparent", b"00-abc-def-01"),), 1_700_000_000_123)
    assert Origin.from_record(record) == expected
    assert Origin.from_record(as_faust(record)) == expected
    assert value_of(record) == value_of(as_faust(record)) == b"{}"


def test_faust_seconds_come_back_as_the_milliseconds_they_were() -> None:
    assert all(int(ms / 1000.0 * 1000) == ms - 1 for ms in AWKWARD_MS)
    for ms in STAMPS:
        assert Origin.from_record(as_faust(consumed(timestamp=ms))).timestamp_ms == ms


def test_headers_are_normalised_alike_null_values_included() -> None:
    headers: list[tuple[str, bytes | None]] = [("a", b"1"), ("null", None), ("a", b"2")]
    for record in (consumed(headers=headers), as_faust(consumed(headers=headers))):
        assert Origin.from_record(record).headers == (("a", b"1"), ("null", b""), ("a", b"2"))
    message = as_faust(consumed())
    message.headers = {"x": b"y", "n": None}  # faust's type allows a mapping
    assert Origin.from_record(message).headers == (("x", b"y"), ("n", b""))
    message.headers = None
    assert Origin.from_record(message).headers == ()


def test_a_record_without_timestamp_or_value() -> None:
    for record in (consumed(timestamp=None, value=None),
                   as_faust(consumed(timestamp=None, value=None))):
        assert Origin.from_record(record).timestamp_ms is None
        assert value_of(record) == b""


def test_a_null_header_value_is_dead_lettered_not_a_crash() -> None:
    record = consumed(headers=[("traceparent", None), ("x", None)])
    outcome = handle(b"{bad", Origin.from_record(record), CONTEXT)
    (letter,) = outcome.records
    assert dict(letter.headers)["x"] == b""


def test_the_handler_context_reads_the_settings_limits_once_and_keeps_them_on_replace() -> None:
    settings = Settings(prompts_topic="p", audit_topic="a", dlq_topic="d", group_id="g",
                        max_chunks=7, max_message_bytes=500_000)
    context = HandlerContext(settings=settings, registry=CONTEXT.registry)
    assert context.limits == Limits(max_chunks=7)
    assert replace(context, schemas={}).limits == Limits(max_chunks=7)
    with pytest.raises(TypeError):
        HandlerContext(settings, CONTEXT.registry)  # type: ignore[call-arg]
