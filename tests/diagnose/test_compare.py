from tests.factories import example, policy
from worker.diagnose.compare import compare, decisions
from worker.engine import assemble
from worker.intake.codec import encode
from worker.intake.policies import load_preset


def records(request_id: str, **sections: dict[str, object]) -> tuple[bytes, bytes]:
    chosen = policy(**sections) if sections else load_preset("estimated")
    result = assemble(example(request_id), chosen)
    return encode(result.prompt), encode(result.audit)


def test_the_same_bytes_are_identical() -> None:
    result = compare("q30-staff", "in/0/1", records("q30-staff"), records("q30-staff"))
    assert (result.status, result.lines) == ("identical", [])


def test_a_tighter_budget_names_each_changed_chunk_with_both_reasons() -> None:
    before = records("q30-staff")
    after = records("q30-staff", tokenizer={"encoding": "chars/4"}, budget={"context_tokens": 300})
    result = compare("q30-staff", "in/0/1", before, after)
    assert result.status == "different"
    text = result.render()
    assert "policy: estimated sha256:" in text
    assert ("chunk wp-2-periods (rank 2): kept as [wp-2-periods] -> dropped: over_budget "
            "(needs 314 tokens, 195 of 300 left)") in text
    assert "chunk pw2400-safety (rank 5): kept as [pw2400-safety] -> dropped: over_budget" in text
    assert "pw2200-winter" not in text  # dropped as a copy both times: unchanged
    assert "tokens: context 617 -> 196, prompt" in text and "budget 1500 -> 300" in text
    assert "--- published" in text and "+++ replayed" in text


def test_missing_and_rejected() -> None:
    assert compare("r", "in/0/2", None, records("parts")).status == "not published"
    assert compare("r", "in/0/3", None, "schema: question: Field required").status == "identical"
    now_rejected = compare("r", "in/0/4", records("parts"), "policy: no preset named 'x'")
    assert now_rejected.status == "different" and "now rejected" in now_rejected.lines[0]


def test_decisions_read_like_the_explain_table() -> None:
    audit = assemble(example("q30-customer"), load_preset("estimated")).audit
    assert decisions(audit)["wcp-3-pumps"].startswith("dropped: access_denied")
    assert decisions(audit)["wp-2-periods"] == "kept as [wp-2-periods]"
