"""The compatibility checker on synthetic changes: inputs may only widen, outputs only narrow."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from context_assembler.contract.compat import breaking_changes
from context_assembler.contract.models import AssembledPrompt, AssemblyAudit, RetrievalResult
from context_assembler.generate.schemas import snapshot_dir

Schema = dict[str, Any]

BASE: Schema = {
    "type": "object",
    "additionalProperties": False,
    "required": ["id", "kind"],
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "kind": {"$ref": "#/$defs/Kind"},
        "score": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
        "count": {"type": "integer", "maximum": 10},
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "meta": {"type": "object", "additionalProperties": True},
    },
    "$defs": {
        "Kind": {"enum": ["a", "b"], "type": "string"},
        "Item": {"type": "object", "additionalProperties": False, "required": ["name"],
                 "properties": {"name": {"type": "string"},
                                "role": {"enum": ["user", "assistant"], "type": "string"}}},
    },
}


def changed(edit: Callable[[Schema], object]) -> Schema:
    schema = copy.deepcopy(BASE)
    edit(schema)
    return schema


def _require_tenant(s: Schema) -> None:
    s["properties"]["tenant"] = {"type": "string"}
    s["required"].append("tenant")


INPUT_BREAKING: dict[str, tuple[Callable[[Schema], object], str]] = {
    "new required field": (_require_tenant, "tenant: required by new, not by old"),
    "removed property": (lambda s: s["properties"].pop("count"),
                         "count: property removed: old events holding it are rejected"),
    "narrowed type": (lambda s: s["properties"].update(score={"type": "number"}),
                      "score: type narrowed: old allows ['null'], new only ['number']"),
    "narrowed enum behind a ref": (lambda s: s["$defs"]["Kind"].update(enum=["a"]),
                                   "kind: values narrowed: old allows ['b'], new does not"),
    "narrowed enum in array items": (
        lambda s: s["$defs"]["Item"]["properties"]["role"].update(enum=["user"]),
        "items[].role: values narrowed: old allows ['assistant'], new does not"),
    "raised lower bound": (lambda s: s["properties"]["id"].update(minLength=3),
                           "id: minLength narrowed: new 3, old 1"),
    "lowered upper bound": (lambda s: s["properties"]["count"].update(maximum=5),
                            "count: maximum narrowed: new 5, old 10"),
    "new pattern": (lambda s: s["properties"]["id"].update(pattern="^[a-z]+$"),
                    "id: pattern changed: None -> '^[a-z]+$'"),
    "closed object": (lambda s: s["properties"]["meta"].update(additionalProperties=False),
                      "meta: additional properties no longer allowed"),
}

INPUT_COMPATIBLE: dict[str, Callable[[Schema], object]] = {
    "new optional field": lambda s: s["properties"].update(tenant={"type": "string"}),
    "widened enum": lambda s: s["$defs"]["Kind"].update(enum=["a", "b", "c"]),
    "integer to number": lambda s: s["properties"]["count"].update(type="number"),
    "field made optional": lambda s: s["required"].remove("kind"),
    "nullable": lambda s: s["properties"].update(
        id={"anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}]}),
    "raised upper bound": lambda s: s["properties"]["count"].update(maximum=20),
    "new description": lambda s: s["properties"]["id"].update(description="The id."),
}

OUTPUT_BREAKING: dict[str, tuple[Callable[[Schema], object], str]] = {
    "removed field": (lambda s: s["properties"].pop("count"), "count: field removed"),
    "field made optional": (lambda s: s["required"].remove("kind"),
                            "kind: required by old, not by new"),
    "widened type": (lambda s: s["properties"].update(
        id={"anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}]}),
        "id: type widened: new allows ['null'], old only ['string']"),
    "retyped field": (lambda s: s["properties"]["count"].update(type="string"),
                      "count: type widened: new allows ['string'], old only ['integer']"),
    "widened enum": (lambda s: s["$defs"]["Kind"].update(enum=["a", "b", "c"]),
                     "kind: values widened: new allows ['c'], old does not"),
    "removed nested field": (lambda s: s["$defs"]["Item"]["properties"].pop("role"),
                             "items[].role: field removed"),
}

OUTPUT_COMPATIBLE: dict[str, Callable[[Schema], object]] = {
    "new field": lambda s: s["properties"].update(tenant={"type": "string"}),
    "narrowed enum": lambda s: s["$defs"]["Kind"].update(enum=["a"]),
    "field made required": lambda s: s["required"].append("count"),
    "never null": lambda s: s["properties"].update(score={"type": "number"}),
}


@pytest.mark.parametrize("change", sorted(INPUT_BREAKING))
def test_an_input_may_not_narrow(change: str) -> None:
    edit, problem = INPUT_BREAKING[change]
    assert breaking_changes(BASE, changed(edit), "input") == [problem]


@pytest.mark.parametrize("change", sorted(INPUT_COMPATIBLE))
def test_an_input_may_widen(change: str) -> None:
    assert breaking_changes(BASE, changed(INPUT_COMPATIBLE[change]), "input") == []


@pytest.mark.parametrize("change", sorted(OUTPUT_BREAKING))
def test_an_output_may_not_widen_or_lose_a_field(change: str) -> None:
    edit, problem = OUTPUT_BREAKING[change]
    assert breaking_changes(BASE, changed(edit), "output") == [problem]


@pytest.mark.parametrize("change", sorted(OUTPUT_COMPATIBLE))
def test_an_output_may_narrow_or_gain_a_field(change: str) -> None:
    assert breaking_changes(BASE, changed(OUTPUT_COMPATIBLE[change]), "output") == []


def test_a_schema_is_compatible_with_itself_both_ways() -> None:
    for model in (RetrievalResult, AssemblyAudit):
        schema = model.model_json_schema()
        assert breaking_changes(schema, schema, "input") == []
        assert breaking_changes(schema, schema, "output") == []


def test_recursive_definitions_are_compared_once() -> None:
    tree: Schema = {"$ref": "#/$defs/Node", "$defs": {"Node": {
        "type": "object", "required": ["children"],
        "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                       "label": {"type": "string"}}}}}
    narrowed = copy.deepcopy(tree)
    narrowed["$defs"]["Node"]["properties"]["label"]["maxLength"] = 8
    assert breaking_changes(tree, tree, "input") == []
    assert breaking_changes(tree, narrowed, "input") == ["label: maxLength narrowed: new 8, old none"]


def test_a_real_model_change_is_caught() -> None:
    """A history role narrowed on the input: the checker sees through pydantic's $defs."""
    old = RetrievalResult.model_json_schema()
    new = copy.deepcopy(old)
    new["$defs"]["HistoryTurn"]["properties"]["role"]["enum"] = ["user"]
    assert breaking_changes(old, new, "input") == [
        "history[].role: values narrowed: old allows ['assistant'], new does not"]


def test_the_provider_request_is_an_optional_field_the_prompt_gained() -> None:
    """Version 1's prompt as first published, against the current one: the provider
    request is a new, optional output field, which the checker lets an output gain; made
    required, or taken away from a snapshot that has it, it would break readers."""
    old = json.loads((snapshot_dir(1) / "assembled-prompt.schema.json").read_text("utf-8"))
    new = AssembledPrompt.model_json_schema()
    assert "provider_request" not in old["properties"] and "provider_request" in new["properties"]
    assert "provider_request" not in new["required"]
    assert breaking_changes(old, new, "output") == []
    assert breaking_changes(new, old, "output") == ["provider_request: field removed"]


def test_the_sentences_kept_are_an_optional_field_a_kept_chunk_gained() -> None:
    """Version 1's audit as first published, against the current one: a kept chunk's
    sentences are a new, optional output field inside `kept[]`; taken away from a snapshot
    that has them, they would break readers."""
    old = json.loads((snapshot_dir(1) / "assembly-audit.schema.json").read_text("utf-8"))
    new = AssemblyAudit.model_json_schema()
    assert "sentences" not in old["$defs"]["KeptChunk"]["properties"]
    assert "sentences" in new["$defs"]["KeptChunk"]["properties"]
    assert "sentences" not in new["$defs"]["KeptChunk"]["required"]
    assert breaking_changes(old, new, "output") == []
    assert breaking_changes(new, old, "output") == ["kept[].sentences: field removed"]
