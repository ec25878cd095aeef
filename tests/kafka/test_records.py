"""The record mapping both delivery paths share, without a broker."""

import orjson

from schemas.models import RetrievalResult
from tests.factories import EXAMPLES
from worker.codec import Limits, encode
from worker.engine import assemble
from worker.engine.policy import Policy
from worker.kafka.records import ERR, HandlerContext, Origin, Outcome, handle
from worker.policies import PolicyRegistry

CONTEXT = HandlerContext(PolicyRegistry(Policy()), Limits(), "prompts", "audit", "dlq",
                         "context-assembler")
GOOD = (EXAMPLES / "events.jsonl").read_bytes().splitlines()[0]


def origin(headers: tuple[tuple[str, bytes], ...] = ()) -> Origin:
    return Origin("retrieval.results", 2, 41, b"q30-staff", headers, 1_700_000_000_000)


def run(raw: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> Outcome:
    return handle(raw, origin(headers), CONTEXT)


def test_a_good_event_gives_a_prompt_and_an_audit_with_the_file_modes_bytes() -> None:
    outcome = run(GOOD, (("traceparent", b"00-abc-def-01"), ("other", b"x")))
    prompt, audit = outcome.records
    expected = assemble(RetrievalResult.model_validate_json(GOOD), Policy())
    assert (prompt.topic, audit.topic) == ("prompts", "audit")
    assert prompt.value == encode(expected.prompt) and audit.value == encode(expected.audit)
    assert prompt.key == audit.key == b"q30-staff"
    headers = dict(prompt.headers)
    assert headers["traceparent"] == b"00-abc-def-01"
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


def test_an_unknown_policy_is_a_transformation_error() -> None:
    raw = orjson.dumps({"request_id": "r2", "question": "q", "policy": "nope"})
    (letter,) = run(raw).records
    assert dict(letter.headers)[f"{ERR}stage"] == b"TRANSFORMATION"


def test_the_dead_letter_headers_are_the_ones_the_asyncapi_file_lists() -> None:
    from schemas.generate import DEAD_LETTER_HEADERS

    (letter,) = run(b"{bad").records
    assert [k.removeprefix(ERR) for k, _ in letter.headers if k.startswith(ERR)] == DEAD_LETTER_HEADERS
