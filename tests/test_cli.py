"""The file mode as a user runs it: JSONL in, JSONL out, errors with their origin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.factories import EXAMPLES
from worker.cli import main


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_assemble_writes_prompts_and_audits_in_input_order(tmp_path: Path) -> None:
    out, audit = tmp_path / "prompts.jsonl", tmp_path / "audit.jsonl"
    status = main(["assemble", str(EXAMPLES / "events.jsonl"), "--out", str(out), "--audit", str(audit)])
    assert status == 0
    expected = [json.loads(line)["request_id"] for line in (EXAMPLES / "events.jsonl").read_text().splitlines()]
    assert [p["request_id"] for p in lines(out)] == expected
    assert [a["request_id"] for a in lines(audit)] == expected


def test_bad_lines_become_error_records_and_the_rest_is_assembled(tmp_path: Path) -> None:
    good = (EXAMPLES / "events.jsonl").read_text().splitlines()
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes("\n".join([
        good[0], "{oops", good[1], '{"request_id": "r9", "question": 5}',
        '{"request_id": "r10", "question": "q", "policy": "nope"}', good[2],
    ]).encode() + b"\n\xff\xfe\n")
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    status = main(["assemble", str(mixed), "--out", str(out), "--errors", str(errors)])
    assert status == 1
    assert len(lines(out)) == 3
    records = lines(errors)
    assert [(r["origin"], r["reason"]) for r in records] == [
        (f"{mixed}:2", "json"), (f"{mixed}:4", "schema"), (f"{mixed}:5", "policy"), (f"{mixed}:7", "json")]
    assert records[1]["request_id"] == "r9" and records[0]["raw"] == "{oops"


def test_same_input_same_bytes(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for target in (first, second):
        assert main(["assemble", str(EXAMPLES / "events.jsonl"), "--out", str(target),
                     "--policy", "estimated"]) == 0
    assert first.read_bytes() == second.read_bytes()


def test_explain_prints_the_decisions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "q30-customer", "--events", str(EXAMPLES / "events.jsonl"),
                 "--policy", "estimated"]) == 0
    table = capsys.readouterr().out
    assert "access_denied" in table and "kept as [wp-2-periods]" in table
    assert "near-duplicate of pw2400-winter (rank 3), jaccard 1.000" in table
    assert main(["explain", "missing", "--events", str(EXAMPLES / "events.jsonl")]) == 2


def test_sweep_prints_the_budgets_and_draws_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "sweep.png"
    assert main(["sweep", "q30-staff", "--events", str(EXAMPLES / "events.jsonl"),
                 "--policy", "estimated", "--png", str(png)]) == 0
    table = capsys.readouterr().out
    assert "   300     2 of 5     196  wcp-3-pumps pw2400-winter" in table
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_broken_policy_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[select]\npacking = "greedy"\n')
    assert main(["assemble", str(EXAMPLES / "events.jsonl"), "--policy", str(policy)]) == 2
    assert "select.packing" in capsys.readouterr().err
