"""What the engine's fast paths assume of pydantic and NamedTuple internals (`model_access`).

If a pydantic upgrade breaks one of these, the engine would read wrong or missing fields
silently; these tests fail first, naming the assumption.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from pydantic import BaseModel

from context_assembler.contract.models import (
    AssemblyAudit,
    Chunk,
    DroppedChunk,
    DropReason,
    HistoryTurn,
    RetrievalResult,
)
from context_assembler.engine.assembling import _HEADER_FIELDS
from context_assembler.engine.candidate import Candidate, Drop
from context_assembler.engine.model_access import chunk_document, fields_of, tuple_maker
from tests.factories import chunk

FULL_CHUNK: dict[str, Any] = {
    "chunk_id": "c1", "text": "Pumps need oil.", "doc_id": "manual", "title": "Pump guide",
    "section": "Care", "source": "kb", "doc_type": "manual", "version": "2", "score": 0.5,
    "effective_from": "2024-01-01", "effective_to": "2025-01-01", "audience": ["staff"],
}


def assert_fields_are_the_attributes(model: BaseModel) -> None:
    fields = fields_of(model)
    names = type(model).model_fields
    assert set(names) <= set(fields), f"pydantic no longer keeps every field in __dict__: {names}"
    for name in names:
        assert fields[name] is getattr(model, name), f"__dict__[{name!r}] is not the attribute"


@pytest.mark.parametrize("made", [
    pytest.param(lambda: Chunk.model_validate(FULL_CHUNK), id="validated"),
    pytest.param(lambda: Chunk.model_validate_json(
        RetrievalResult(request_id="r", question="q", chunks=[FULL_CHUNK]).chunks[0]
        .model_dump_json()), id="from json"),
    pytest.param(lambda: Chunk.model_validate(FULL_CHUNK).model_copy(update={"text": "other"}),
                 id="copied with an update"),
    pytest.param(lambda: chunk("c2", "bare"), id="defaults"),
])
def test_a_models_dict_holds_every_field_as_its_attribute(made: Any) -> None:
    assert_fields_are_the_attributes(made())


def test_the_dict_holds_validated_values() -> None:
    fields = fields_of(Chunk.model_validate(FULL_CHUNK))
    assert fields["effective_from"] == date(2024, 1, 1)  # a date, not the string sent
    assert fields["audience"] == ["staff"]


def test_other_models_the_engine_reads_keep_their_fields_too() -> None:
    event = RetrievalResult.model_validate({
        "request_id": "r", "question": "q", "chunks": [FULL_CHUNK],
        "history": [{"role": "user", "content": "hi"}],
    })
    for model in (event, event.chunks[0], event.history[0],
                  HistoryTurn(role="assistant", content="hello")):
        assert_fields_are_the_attributes(model)


@pytest.mark.parametrize("doc_id", ["manual", None])
def test_chunk_document_answers_as_the_model_property(doc_id: str | None) -> None:
    made = chunk("c1", "text", doc_id=doc_id)
    assert chunk_document(fields_of(made)) == made.document
    assert Candidate(1, made).document == made.document


def test_a_drop_made_in_c_equals_one_made_by_its_own_constructor() -> None:
    values = ("c1", "manual", 3, DropReason.DUPLICATE, "same text", "c0", 1.0)
    made = tuple_maker(Drop)(values)
    assert type(made) is Drop
    assert made == Drop(*values)
    assert made.rank == 3 and made.similarity == 1.0


def test_a_drop_is_field_for_field_the_audits_dropped_chunk() -> None:
    """The audit validates Drop tuples by attribute (`assemble._records`): the names must be
    the model's, and strict validation must read every one as sent."""
    assert Drop._fields == tuple(DroppedChunk.model_fields)
    drop = Candidate(2, chunk("c2", "text")).drop(
        DropReason.NEAR_DUPLICATE, "near", duplicate_of="c1", similarity=0.912345
    )
    audit = AssemblyAudit.model_validate(
        {"request_id": "r", "policy": {"name": "default", "hash": "h"}, "engine": {"version": "1"},
         "kept": [], "dropped": [drop], "tokens": {"context": 0, "prompt": 1, "budget": 1,
                                                    "tokenizer": "cl100k_base"},
         "abstained": True, "history_turns_dropped": 0},
        from_attributes=True,
        strict=True,
    )
    assert audit.dropped == [DroppedChunk(**drop._asdict())]
    assert audit.dropped[0].similarity == 0.9123


def test_every_header_field_read_by_name_is_a_chunk_field() -> None:
    made = Chunk.model_validate(FULL_CHUNK)
    for style, read in _HEADER_FIELDS.items():
        assert read(fields_of(made)), style  # a KeyError names a field pydantic renamed
