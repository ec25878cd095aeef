"""`evaluate`: answers and gold passages kept at each budget, against top-k truncation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from context_assembler.cli.main import main
from context_assembler.diagnose.evaluate import (
    TRUNCATION,
    UnusableRecord,
    evaluate,
    normalise_answer,
    read_labelled,
    table,
    truncated,
)
from context_assembler.engine.tokens import get_counter
from context_assembler.intake.policy_registry import load_preset
from tests.factories import chunk, event

FILLER = " ".join(f"Filler sentence {n} is about the weather." for n in range(10))


def _labelled(tmp_path: Path) -> Path:
    chunks = [chunk(f"f{n}", FILLER, title=f"Weather {n}") for n in range(5)]
    chunks.append(chunk("gold", f"{FILLER} The bridge opened on 12 May 1937.", title="Bridge"))
    records = [
        {"event": event(chunks, question="when did the bridge open",
                        request_id="q1").model_dump(mode="json"),
         "answers": ["May 12, 1937", "12 May 1937"], "gold": "gold"},
        {"event": event(chunks[:1], question="what is filler", request_id="q2")
         .model_dump(mode="json"), "gold": ["f0"]},
    ]
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return path


def test_answers_are_normalised_as_squad_does() -> None:
    assert normalise_answer("The  U.S. Army!") == "us army"
    assert normalise_answer("An apple, a day") == "apple day"


def test_focused_keeps_the_answer_truncation_and_default_cut(tmp_path: Path) -> None:
    records = read_labelled(_labelled(tmp_path))
    scores = evaluate(records, [load_preset("default"), load_preset("focused")], [120, 2000])
    by = {(s.policy, s.budget): s for s in scores}
    assert by[(TRUNCATION, 120)].answers_kept == 0.0
    assert by[("default", 120)].answers_kept == 0.0
    assert by[("focused", 120)].answers_kept == 1.0
    assert by[("focused", 120)].gold_kept == 1.0  # both questions name their gold
    assert by[("focused", 2000)].answers_kept == 1.0
    assert by[(TRUNCATION, 2000)].mean_gold_position == 3.5  # rank 6 and rank 1
    assert all(s.over_budget == 0 and s.failed == 0 for s in scores)
    assert all(s.mean_context_tokens <= s.budget for s in scores)
    lines = table(scores).splitlines()
    assert len(lines) == 1 + len(scores)
    assert lines[0].split()[:2] == ["policy", "budget"]


def test_truncation_cuts_at_the_budgets_token() -> None:
    counter = get_counter("cl100k_base")
    evented = event([chunk("a", FILLER, title="A"), chunk("b", FILLER, title="B")])
    for budget in (1, 50, 137, 400):
        context, reached = truncated(evented, budget, counter)
        assert counter.count(context) <= budget
        assert reached == (1 if budget < counter.count(f"A\n{FILLER}") + 3 else 2)


def test_a_line_without_answers_or_gold_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"event": event([chunk("a", "x")]).model_dump(mode="json")})
                    + "\n", "utf-8")
    with pytest.raises(UnusableRecord, match=r"bad.jsonl:1: give `answers` or `gold`"):
        read_labelled(path)
    path.write_text("{not json\n", "utf-8")
    with pytest.raises(UnusableRecord, match="not JSON"):
        read_labelled(path)


def test_the_command_prints_a_row_per_policy_and_budget_and_draws_the_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "mine.toml"
    policy.write_text('[compress]\nmode = "focused"\n', "utf-8")
    chart = tmp_path / "kept.png"
    code = main(["evaluate", str(_labelled(tmp_path)), "--policy", "default", "--policy",
                 str(policy), "--budgets", "120,2000", "--chart", str(chart)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()[2:] if not line.startswith("chart")]
    assert [(row[0], row[1]) for row in rows if row[0] != "top-k"] == [
        ("default", "120"), ("default", "2000"), ("mine", "120"), ("mine", "2000")]
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_an_unknown_policy_is_an_operator_error(tmp_path: Path) -> None:
    assert main(["evaluate", str(_labelled(tmp_path)), "--policy", "no-such"]) == 2
