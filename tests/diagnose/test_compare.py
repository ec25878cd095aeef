from context_assembler.diagnose.compare import compare, decisions
from context_assembler.engine import assemble
from context_assembler.engine.version import __version__
from context_assembler.intake.codec import encode
from context_assembler.intake.policy_registry import load_preset
from tests.factories import example, policy


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


def _as_made_by(records: tuple[bytes, bytes], version: str) -> tuple[bytes, bytes]:
    current = f'"version":"{__version__}"'.encode()
    return records[0].replace(current, f'"version":"{version}"'.encode()), records[1].replace(
        current, f'"version":"{version}"'.encode())


def test_another_engine_version_is_named_even_when_nothing_else_changed() -> None:
    published = _as_made_by(records("q30-staff"), "0.0.9")
    result = compare("q30-staff", "in/0/1", published, records("q30-staff"))
    assert result.status == "different"
    assert result.lines == [
        f"engine: published by 0.0.9, replayed by {__version__}: the engine's decisions "
        "changed between them, so a difference may come from the code, not the policy",
        "the same decisions, token figures and prompt text",
    ]


def test_another_engine_version_comes_before_the_changed_decisions() -> None:
    published = _as_made_by(records("q30-staff"), "0.0.9")
    tighter = records("q30-staff", tokenizer={"encoding": "chars/4"}, budget={"context_tokens": 300})
    lines = compare("q30-staff", "in/0/1", published, tighter).lines
    assert lines[1].startswith("engine: published by 0.0.9, replayed by")
    assert any(line.startswith("chunk wp-2-periods (rank 2): kept") for line in lines)
