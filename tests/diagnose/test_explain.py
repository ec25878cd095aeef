"""The decision table counts every row as the engine counts a passage: with the policy's own
labels, so a dropped copy costs what its kept twin costs."""

from __future__ import annotations

from pathlib import Path

import pytest

import context_assembler as ca
from context_assembler.diagnose.explain import decision_table
from context_assembler.engine.policy import policy_from_mapping

EVENT = ca.RetrievalResult.model_validate_json(
    (Path(__file__).parents[2] / "examples" / "event.json").read_text("utf-8"))


def tokens_by_chunk(table: str) -> dict[str, int]:
    rows = [line.split() for line in table.splitlines()[2:]]
    return {row[1]: int(row[3]) for row in rows}


@pytest.mark.parametrize("labels", ["chunk_id", "S{n}", "{n}"])
def test_a_dropped_copy_costs_what_its_kept_twin_costs(labels: str) -> None:
    policy = policy_from_mapping({"render": {"labels": labels}})
    audit = ca.assemble(EVENT, policy).audit
    (copy,) = [d for d in audit.dropped if d.reason.value == "near_duplicate"]
    assert copy.duplicate_of is not None
    tokens = tokens_by_chunk(decision_table(EVENT, audit, policy))
    (twin,) = [k for k in audit.kept if k.chunk_id == copy.duplicate_of]
    assert tokens[copy.chunk_id] == tokens[twin.chunk_id] == twin.tokens
