import orjson
import pytest

from schemas.models import RetrievalResult
from worker.codec import Limits, RejectedInput, decode_event, encode


def reject(raw: bytes, limits: Limits | None = None) -> RejectedInput:
    with pytest.raises(RejectedInput) as caught:
        decode_event(raw, limits or Limits())
    return caught.value


def test_invalid_json_and_invalid_utf8_are_json_errors() -> None:
    assert reject(b"{not json").reason == "json"
    assert reject(b'{"request_id": "\xff\xfe"}').reason == "json"


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


def test_encoding_is_stable_and_round_trips() -> None:
    event = decode_event(b'{"request_id":"r","question":"q","chunks":[{"chunk_id":"a","text":"t","version":3}]}',
                         Limits())
    assert event.chunks[0].version == "3"
    assert encode(event) == encode(RetrievalResult.model_validate_json(encode(event)))
