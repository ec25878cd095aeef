import hashlib
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from context_assembler.contract import models
from context_assembler.contract.models import RejectReason, RetrievalResult
from context_assembler.diagnose.explain import printable
from context_assembler.engine import Policy, assemble
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.policy import policy_from_mapping
from context_assembler.intake.codec import (
    Excerpt,
    Limits,
    RejectedInput,
    decode_event,
    encode,
    encode_error_record,
)
from context_assembler.intake.policy_registry import load_policy


def reject(raw: bytes | Excerpt, limits: Limits | None = None) -> RejectedInput:
    with pytest.raises(RejectedInput) as caught:
        decode_event(raw, limits or Limits())
    return caught.value


def test_invalid_json_and_invalid_utf8_are_json_errors() -> None:
    assert reject(b"{not json").reason == "json"
    assert reject(b'{"request_id": "\xff\xfe"}').reason == "json"


def test_invalid_utf8_is_named_with_its_byte_offset() -> None:
    assert reject(b'{"request_id": "\xff\xfe"}').message == "not valid UTF-8 at byte 16"
    surrogate = reject(b'{"request_id": "r\xed\xa0\x80"}')  # UTF-8 of a lone surrogate
    assert surrogate.message == "not valid UTF-8 at byte 17"


@pytest.mark.parametrize(("number", "message"), [
    (b"NaN", "NaN and Infinity are not JSON numbers (line 1 column 33)"),
    (b"-Infinity", "NaN and Infinity are not JSON numbers (line 1 column 34)"),
    (b"1e999", "the number at line 1 column 33 is too large for a double (infinity)"),
])
def test_numbers_that_are_not_finite_are_refused_clearly(number: bytes, message: str) -> None:
    error = reject(b'{"request_id": "r", "question": ' + number + b"}")
    assert (error.reason, error.message) == ("json", "not valid JSON: " + message)


def test_version_numbers_must_be_text() -> None:
    for version, hint in ((b"1.10", '"1.1" or "1.10"'), (b"3", 'such as "3"')):
        error = reject(b'{"request_id":"r","question":"q","chunks":[{"chunk_id":"a","text":"t",'
                       b'"version":' + version + b"}]}")
        assert error.reason == "schema" and "version must be a string" in error.message
        assert hint in error.message
    event = decode_event(b'{"request_id":"r","question":"q","chunks":[{"chunk_id":"a","text":"t",'
                         b'"version":"1.10"}]}', Limits())
    assert event.chunks[0].version == "1.10"


def chunk_event(field: str, value: str) -> bytes:
    return f'{{"request_id":"r","question":"q","chunks":[{{"chunk_id":"a","text":"t",'\
           f'"{field}":{value}}}]}}'.encode()


@pytest.mark.parametrize("field, value", [
    ("score", '"0.9"'), ("score", "true"), ("score", "false"), ("embedding", '["0.5"]'),
    ("embedding", "[true]"), ("effective_from", "1700000000"), ("effective_to", "1700000000"),
    ("effective_to", '"1700000000"'), ("effective_to", "1.5"), ("effective_to", "true"),
    ("effective_from", '"2026-01-01T00:00:00"'), ("effective_to", '"\\uff12\\uff10\\uff12\\uff16-\\uff10\\uff11-\\uff10\\uff11"'),
])
def test_values_of_another_json_type_than_the_schema_says_are_refused(
    field: str, value: str
) -> None:
    assert reject(chunk_event(field, value)).reason == "schema"


@pytest.mark.parametrize("value", ["1700000000", '"1700000000"', '"20260101"', "false"])
def test_as_of_is_a_date_written_as_text(value: str) -> None:
    error = reject(f'{{"request_id":"r","question":"q","as_of":{value}}}'.encode())
    assert error.reason == "schema" and '"YYYY-MM-DD"' in error.message


def test_the_types_the_schema_allows_are_accepted() -> None:
    chunk = decode_event(chunk_event("score", "1"), Limits()).chunks[0]
    assert chunk.score == 1.0
    dated = decode_event(chunk_event("effective_to", '"2026-03-31"'), Limits()).chunks[0]
    assert str(dated.effective_to) == "2026-03-31"


def event_with(metadata: str) -> bytes:
    return ('{"request_id": "r", "question": "q", "chunks": [{"chunk_id": "a", "text": "t"}], '
            f'"metadata": {metadata}}}').encode()


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"request_id": "r", "question": "q", "chunks": [], "question": "q"}',
     "duplicate key 'question' in the event"),
    (b'{"request_id": "r", "question": "q", "chunks": [{"chunk_id": "a", "text": "t"}, '
     b'{"chunk_id": "b", "text": "t", "text": "u"}]}', "duplicate key 'text' in chunks[1]"),
    (event_with('{"a b": [{"x": 1, "x": 1}]}'), "duplicate key 'x' in metadata['a b'][0]"),
    # the copy orjson drops holds the colons: counting colons still sees it
    (event_with('{"k": "::", "k": "v"}'), "duplicate key 'k' in metadata"),
    # Go's encoder writes "<" as \u003c: no colon in that
    (event_with('{"k": "\\u003c/p\\u003e", "k": 1}'), "duplicate key 'k' in metadata"),
    # the same key spelled with an escaped colon
    (event_with('{"a:": 1, "a\\u003a": 2}'), "duplicate key 'a:' in metadata"),
    # deeper than orjson re-encodes (254 levels)
    (event_with('{"v": ' + "[" * 300 + '{"z": 1, "z": 2}' + "]" * 300 + "}"),
     "duplicate key 'z' in metadata.v" + "[0]" * 300),
])
def test_duplicate_keys_are_refused_with_where_they_are(raw: bytes, message: str) -> None:
    error = reject(raw)
    assert (error.reason, error.message, error.request_id) == ("json", message, "r")


def test_a_repeated_request_id_names_no_request() -> None:
    error = reject(b'{"request_id": "r", "question": "q", "request_id": "s"}')
    assert (error.message, error.request_id) == ("duplicate key 'request_id' in the event", None)


def test_colons_in_strings_and_escapes_are_not_duplicates() -> None:
    for metadata in ('{"a:b": "c:d", "e": "\\u003a :: \\\\u003a \\u003c"}',
                     '{"v": ' + "[" * 300 + "{}" + "]" * 300 + "}"):
        assert decode_event(event_with(metadata), Limits()).request_id == "r"


KEYS = st.sampled_from(["a", "b", "a:", ":", 'q"', "é"])
SCALARS = st.one_of(st.integers(-10, 10), st.text(":a\\\"é\x1b", max_size=4), st.none())


def spelled(value: str, escape_colons: bool) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text.replace(":", "\\u003a") if escape_colons else text


@st.composite
def json_text(draw: st.DrawFn, depth: int = 0) -> str:
    """JSON text whose objects may repeat a key, with colons spelled either way."""
    kind = draw(st.sampled_from(["scalar", "list", "object"] if depth < 3 else ["scalar"]))
    if kind == "scalar":
        value = draw(SCALARS)
        return spelled(value, draw(st.booleans())) if isinstance(value, str) else json.dumps(value)
    items = draw(st.lists(json_text(depth + 1), max_size=3))
    if kind == "list":
        return "[" + ", ".join(items) + "]"
    keys = [spelled(draw(KEYS), draw(st.booleans())) for _ in items]
    return "{" + ", ".join(f"{k}: {v}" for k, v in zip(keys, items, strict=True)) + "}"


def repeats_a_key(text: str) -> bool:
    found = False

    def members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        found = found or len({k for k, _ in pairs}) < len(pairs)
        return dict(pairs)

    json.loads(text, object_pairs_hook=members)
    return found


@settings(max_examples=300, deadline=None)
@given(json_text())
def test_a_repeated_key_is_refused_exactly_when_there_is_one(value: str) -> None:
    raw = event_with('{"v": ' + value + "}")
    try:
        decode_event(raw, Limits())
        refused = False
    except RejectedInput as error:
        assert error.message.startswith("duplicate key"), error.message
        refused = True
    assert refused == repeats_a_key(value)


def test_schema_errors_name_the_field_and_keep_the_request_id() -> None:
    error = reject(orjson.dumps({"request_id": "r7", "question": "q", "chunks": [{"text": "t"}]}))
    assert (error.reason, error.request_id) == ("schema", "r7")
    assert "chunks.0.chunk_id" in error.message
    assert reject(b"[1, 2]").reason == "schema"
    assert "unexpected" in reject(orjson.dumps({"request_id": "r", "question": "q", "colour": 1})).message.lower() \
        or "extra" in reject(orjson.dumps({"request_id": "r", "question": "q", "colour": 1})).message.lower()


def test_limits_apply_before_the_engine_sees_anything() -> None:
    big = orjson.dumps({"request_id": "r", "question": "q", "chunks": []}) + b" " * 100
    assert reject(big, Limits(max_event_bytes=50)).reason == "limits"
    many = orjson.dumps({"request_id": "r", "question": "q",
                         "chunks": [{"chunk_id": str(i), "text": "t"} for i in range(3)]})
    error = reject(many, Limits(max_chunks=2))
    assert (error.reason, error.request_id) == ("limits", "r")
    long = orjson.dumps({"request_id": "r", "question": "q", "chunks": [{"chunk_id": "a", "text": "x" * 11}]})
    assert "max_chunk_chars" in reject(long, Limits(max_chunk_chars=10)).message


def test_error_records_keep_the_original_input_and_origin() -> None:
    record = reject(b"\xffbroken").record("events.jsonl:3", b"\xffbroken")
    assert record.origin == "events.jsonl:3" and record.reason == "json"
    assert record.raw.endswith("broken")
    assert (record.raw_bytes, record.raw_truncated) == (7, False)
    assert record.raw_sha256 == "sha256:" + hashlib.sha256(b"\xffbroken").hexdigest()


def test_error_records_keep_only_the_first_kib_cut_between_characters() -> None:
    raw = b"x" + "é".encode() * 2000  # the 1024th byte is the middle of an é
    record = RejectedInput(RejectReason.JSON, "m").record("f:1", raw)
    assert record.raw == "x" + "é" * 511 and len(record.raw.encode()) == 1023
    assert (record.raw_bytes, record.raw_truncated) == (4001, True)
    assert record.raw_sha256 == "sha256:" + hashlib.sha256(raw).hexdigest()
    assert RejectedInput(RejectReason.JSON, "m").record("f:1", Excerpt.of(raw)) == record


def test_an_excerpt_is_rejected_for_its_length_without_being_read() -> None:
    error = reject(Excerpt.of(b"{}" * 100), Limits(max_event_bytes=50))
    assert (error.reason, error.message) == ("limits", "event is 200 bytes, over max_event_bytes=50")


def test_encoding_is_stable_and_round_trips() -> None:
    event = decode_event(b'{"request_id":"r","question":"q","chunks":[{"chunk_id":"a","text":"t","version":"3"}]}',
                         Limits())
    assert event.chunks[0].version == "3"
    assert encode(event) == encode(RetrievalResult.model_validate_json(encode(event)))


def test_a_reason_is_one_of_the_rejection_reasons() -> None:
    """The reason a record and a dead letter carry is a RejectReason, which compares equal to
    its text; a reason that is not one fails where the rejection is made."""
    error = RejectedInput("schema", "m")  # type: ignore[arg-type]
    assert error.reason == "schema"  # as the Kafka side compares it
    assert error.reason is RejectReason.SCHEMA
    assert f"RejectedInput.{error.reason}" == "RejectedInput.schema"
    assert encode(error.record("f:1", b"x")).startswith(b'{"schema_version":1,"origin":"f:1","reason":"schema"')
    with pytest.raises(ValueError, match="nonsense"):
        RejectedInput("nonsense", "m")  # type: ignore[arg-type]


def test_a_rejection_is_one_of_the_projects_errors() -> None:
    assert issubclass(RejectedInput, ContextAssemblerError) and issubclass(RejectedInput, ValueError)


def _models() -> list[type[BaseModel]]:
    return [
        value for value in vars(models).values()
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == models.__name__
    ]


def test_encode_writes_what_pydantic_json_mode_writes() -> None:
    """`encode` lets orjson walk the models' fields: that holds only while no model renames,
    computes or serializes a field its own way (but for the serializers that leave out an
    absent provider request or sentence count, as `encode` does)."""
    for model in _models():
        decorators = model.__pydantic_decorators__
        serializers = list(decorators.model_serializers)
        absent_when_none = model in (models.AssembledPrompt, models.KeptChunk)
        assert serializers == (["_absent_when_none"] if absent_when_none else []), model
        assert not decorators.field_serializers, model
        assert not model.model_computed_fields, model
        assert all(f.alias is None and f.serialization_alias is None for f in model.model_fields.values()), model
    raw = (b'{"request_id":"r","question":"q \\u00e9?","audience":"staff","as_of":"2026-03-01",'
           b'"history":[{"role":"user","content":"hi"}],"metadata":{"n":1e300,"x":[1,{"y":null}]},'
           b'"chunks":[{"chunk_id":"a","text":"Pump\\nA PW-2400 pump, 3 years.","version":"3","score":1,'
           b'"effective_from":"2025-01-01","effective_to":"2027-12-31","audience":["staff"],'
           b'"embedding":[0.5,1]},{"chunk_id":"b","text":"Pump\\nA PW-2400 pump, 3 years.","score":0.5}]}')
    event = decode_event(raw, Limits())
    assembly = assemble(event, Policy())
    records: list[BaseModel] = [
        event, assembly.prompt, assembly.audit, RejectedInput("schema", "m").record("f:1", raw),  # type: ignore[arg-type]
        *(assemble(event, policy_from_mapping({"render": {"format": form}})).prompt
          for form in ("anthropic", "cohere")),
    ]
    assert assembly.audit.dropped
    for record in records:
        assert encode(record) == orjson.dumps(record.model_dump(mode="json"))
    with pytest.raises(TypeError):
        encode(RetrievalResult.model_construct(request_id="r", question="q", chunks={1, 2}))  # type: ignore[arg-type]


@given(st.text(), st.text())
def test_an_error_record_says_the_same_in_json_with_nothing_a_terminal_acts_on(
    request_id: str, raw: str,
) -> None:
    rejected = RejectedInput(RejectReason.SCHEMA, f"bad {raw}", request_id)
    record = rejected.record("in.jsonl:1", raw.encode("utf-8", "replace"))
    shown = encode_error_record(record)
    assert json.loads(shown) == json.loads(encode(record))
    text = shown.decode()
    assert printable(text) == text  # no control, bidi or line-separator character left raw


@pytest.mark.parametrize("preset", ["default", "focused"])
def test_encode_writes_the_bytes_the_models_serializers_write(preset: str) -> None:
    """An optional field the contract gained is left out by `encode` where the model's own
    serializer leaves it out: an audit without compression has no `sentences` key."""
    for line in (Path(__file__).parents[2] / "examples" / "events.jsonl").read_bytes().splitlines():
        assembly = assemble(RetrievalResult.model_validate_json(line), load_policy(preset))
        for record in (assembly.prompt, assembly.audit):
            assert encode(record) == record.model_dump_json().encode()
        if preset == "default":
            assert b'"sentences"' not in encode(assembly.audit)
