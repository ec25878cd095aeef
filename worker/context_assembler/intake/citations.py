"""The citation check's intake, for the CLI and the HTTP endpoint: bytes in, a
CitationCheck or a RejectedInput out, with the event limits as its bounds.

An answer may be as large as an event (`max_event_bytes`); a request to the endpoint holds
a prompt and an answer, so it may be twice that. A prompt or answer that is not one is a
`schema` rejection, an answer over the check's bounds a `limits` one.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from context_assembler.contract.models import (
    AnswerRecord,
    AssembledPrompt,
    CitationCheck,
    CitationRequest,
    RejectReason,
)
from context_assembler.engine.citations import check_citations
from context_assembler.engine.errors import AnswerTooLarge, UnreadableAnswer
from context_assembler.intake.codec import Limits, RejectedInput, parse_json, schema_problems


def request_bytes(limits: Limits) -> int:
    """The largest request to the endpoint: a prompt and an answer, each event-sized."""
    return 2 * limits.max_event_bytes


Record = TypeVar("Record", bound=BaseModel)


def _decoded(raw: bytes, model: type[Record], what: str, max_bytes: int) -> Record:
    if len(raw) > max_bytes:
        raise RejectedInput(RejectReason.LIMITS,
                            f"{what} is {len(raw)} bytes, over {max_bytes}")
    obj: Any = parse_json(raw)
    try:
        return model.model_validate(obj)
    except ValidationError as error:
        request_id = obj.get("request_id") if isinstance(obj, dict) else None
        raise RejectedInput(RejectReason.SCHEMA, f"not {what}: {schema_problems(error)}",
                            request_id if isinstance(request_id, str) else None) from None


def decode_request(raw: bytes, limits: Limits) -> CitationRequest:
    return _decoded(raw, CitationRequest, "a citation check request", request_bytes(limits))


def decode_answer(raw: bytes, limits: Limits) -> AnswerRecord:
    return _decoded(raw, AnswerRecord, "an answer record", limits.max_event_bytes)


def decode_prompt(raw: bytes, limits: Limits) -> AssembledPrompt:
    return _decoded(raw, AssembledPrompt, "an AssembledPrompt", limits.max_event_bytes)


def check(answer: str | dict[str, Any], prompt: AssembledPrompt,
          limits: Limits) -> CitationCheck:
    """`check_citations` with the answer bounded as an event is."""
    try:
        return check_citations(answer, prompt, max_answer_chars=limits.max_event_bytes)
    except AnswerTooLarge as error:
        raise RejectedInput(RejectReason.LIMITS, str(error), prompt.request_id) from None
    except UnreadableAnswer as error:
        raise RejectedInput(RejectReason.SCHEMA, str(error), prompt.request_id) from None
