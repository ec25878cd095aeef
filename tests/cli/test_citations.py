"""`context-assembler citations`: answers JSONL checked against the prompts JSONL that
`assemble` wrote, joined by request_id; an answer that cannot be checked gets an error
record with its origin, and the next answer is checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import context_assembler as ca
from context_assembler.cli.main import main
from tests.factories import EXAMPLES


def jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), "utf-8")
    return path


def test_each_answer_is_checked_against_the_prompt_of_its_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts, out, errors = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl", tmp_path / "e.jsonl"
    assert main(["assemble", str(EXAMPLES / "events.jsonl"), "--out", str(prompts)]) == 0
    answers = jsonl(tmp_path / "answers.jsonl", [
        {"request_id": "q30-customer", "answer": "Three years [wp-2-periods] [S9]."},
        {"request_id": "no-such-request", "answer": "x"},
        {"request_id": "q30-customer"},
        {"request_id": "q30-customer", "answer": {
            "message": {"content": [], "citations": [{"sources": [{"id": "pw2400-winter"}]}]}}},
    ])
    status = main(["citations", "--prompts", str(prompts), "--answers", str(answers),
                   "--out", str(out), "--errors", str(errors)])
    assert status == 1  # two answers could not be checked
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [[c["label"] for c in r["cited"]] for r in results] == [["wp-2-periods"],
                                                                   ["pw2400-winter"]]
    assert results[0]["invented"] == ["S9"]
    prompt = next(ca.AssembledPrompt.model_validate_json(line)
                  for line in prompts.read_text().splitlines() if "q30-customer" in line)
    assert results[0] == json.loads(ca.check_citations("Three years [wp-2-periods] [S9].",
                                                       prompt).model_dump_json())
    rejected = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [(r["origin"].rsplit(":", 1)[1], r["reason"]) for r in rejected] == [
        ("2", "schema"), ("3", "schema")]
    assert "no prompt in --prompts" in rejected[0]["message"]
    assert "checked 2, rejected 2" in capsys.readouterr().err


def test_an_answer_over_the_event_size_is_an_error_record(tmp_path: Path) -> None:
    prompts, errors = tmp_path / "prompts.jsonl", tmp_path / "e.jsonl"
    assert main(["assemble", str(EXAMPLES / "events.jsonl"), "--out", str(prompts)]) == 0
    answers = jsonl(tmp_path / "answers.jsonl", [
        {"request_id": "q30-customer", "answer": "x" * 100_000},
        {"request_id": "q30-customer", "answer": "[wp-2-periods]"},
    ])
    status = main(["citations", "--prompts", str(prompts), "--answers", str(answers),
                   "--errors", str(errors), "--out", str(tmp_path / "out.jsonl"),
                   "--max-event-bytes", "50000"])
    assert status == 1
    (rejected,) = [json.loads(line) for line in errors.read_text().splitlines()]
    assert rejected["reason"] == "limits" and rejected["raw_bytes"] > 50_000
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 1
