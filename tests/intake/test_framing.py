"""The Confluent wire format and the check of a framed event against its JSON Schema."""

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_assembler.contract.models import RejectReason
from context_assembler.generate.schemas import json_schemas
from context_assembler.intake.codec import Limits, RejectedInput, decode_event
from context_assembler.intake.framing import (
    HEADER,
    InvalidSchema,
    RegisteredSchema,
    frame,
    schema_id_of,
    split,
    unframed,
)
from tests.factories import EXAMPLES

GOOD = (EXAMPLES / "events.jsonl").read_bytes().splitlines()[0]


@given(st.integers(0, 2**32 - 1), st.binary(max_size=64))
def test_a_frame_gives_back_its_id_and_payload(schema_id: int, payload: bytes) -> None:
    framed = frame(schema_id, payload)
    assert framed[:1] == b"\x00" and len(framed) == HEADER.size + len(payload)
    assert split(framed) == (schema_id, payload)
    assert schema_id_of(framed) == schema_id
    assert unframed(framed) == payload


def test_the_header_is_the_magic_byte_and_a_big_endian_id() -> None:
    assert frame(258, b"{}") == b"\x00\x00\x00\x01\x02{}"


@given(st.binary(max_size=64).filter(lambda raw: raw[:1] != b"\x00"))
def test_anything_not_starting_with_the_magic_byte_is_plain(raw: bytes) -> None:
    assert split(raw) == (None, raw)
    assert schema_id_of(raw) is None
    assert unframed(raw) == raw


def test_a_frame_cut_short_is_rejected_as_a_schema_problem() -> None:
    with pytest.raises(RejectedInput) as caught:
        split(b"\x00\x00\x01")
    assert caught.value.reason == RejectReason.SCHEMA
    assert "shorter than the 5-byte header" in caught.value.message


def test_a_registered_schema_stricter_than_the_contract_rejects_what_the_contract_takes() -> None:
    contract = json_schemas()["retrieval-result"]
    stricter = {**contract, "properties": {**contract["properties"],
                                           "question": {"type": "string", "maxLength": 3}}}
    schema = RegisteredSchema.compile(7, json.dumps(stricter))
    decode_event(GOOD, Limits())  # the contract takes it
    with pytest.raises(RejectedInput) as caught:
        decode_event(GOOD, Limits(), schema.check)
    assert caught.value.reason == RejectReason.SCHEMA
    assert caught.value.message.startswith("does not match schema id 7: question: ")
    assert caught.value.request_id == orjson.loads(GOOD)["request_id"]


def test_the_contract_schema_takes_a_good_event() -> None:
    schema = RegisteredSchema.compile(1, json.dumps(json_schemas()["retrieval-result"]))
    assert decode_event(GOOD, Limits(), schema.check).request_id == orjson.loads(GOOD)["request_id"]


def test_a_rejection_names_a_few_problems_only() -> None:
    schema = RegisteredSchema.compile(3, '{"type": "array", "items": {"type": "string"}}')
    document = list(range(100))
    with pytest.raises(RejectedInput) as caught:
        schema.check(document, None)
    assert caught.value.message.endswith("(and more)")
    assert caught.value.message.count('is not of type "string"') == 5
    assert len(caught.value.message) < 2048


def test_what_is_not_a_json_schema_cannot_be_compiled() -> None:
    with pytest.raises(InvalidSchema, match="12 is not valid"):
        RegisteredSchema.compile(1, '{"type": 12}')
    with pytest.raises(InvalidSchema):
        RegisteredSchema.compile(1, "[1, 2]")
    with pytest.raises(InvalidSchema):
        RegisteredSchema.compile(1, '{"type": ')


def test_a_schema_never_makes_the_worker_fetch_a_reference() -> None:
    with pytest.raises(InvalidSchema, match="Retrieval is disabled"):
        RegisteredSchema.compile(1, '{"$ref": "http://127.0.0.1:9/elsewhere.json"}')


def test_patterns_are_matched_in_linear_time_or_refused() -> None:
    """A pattern a backtracking engine takes exponential time on is matched at once; one
    that needs backtracking (look-around) makes the schema unusable, not slow."""
    nested = RegisteredSchema.compile(1, '{"type": "string", "pattern": "^(a+)+$"}')
    with pytest.raises(RejectedInput):
        nested.check("a" * 100_000 + "!", None)
    with pytest.raises(InvalidSchema):
        RegisteredSchema.compile(1, '{"type": "string", "pattern": "(?=a)a"}')
