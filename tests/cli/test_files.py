"""The file commands as a user runs them: JSONL in, JSONL out, errors with their origin;
explain, sweep and policy."""

from __future__ import annotations

import gc
import json
import os
import tracemalloc
from pathlib import Path

import pytest

from context_assembler.cli.main import main
from context_assembler.collector import GC_THRESHOLDS
from tests.factories import EXAMPLES, naming_policy


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


EVENTS = EXAMPLES / "events.jsonl"


def event_line(**fields: object) -> bytes:
    event: dict[str, object] = {"request_id": "r1", "question": "Which pump kit?", "audience": "staff",
                                "chunks": [{"chunk_id": "a", "text": "The pump kit is PK-2200-07."}]}
    return json.dumps({**event, **fields}).encode() + b"\n"


def test_assemble_writes_prompts_and_audits_in_input_order(tmp_path: Path) -> None:
    out, audit = tmp_path / "prompts.jsonl", tmp_path / "audit.jsonl"
    status = main(["assemble", str(EXAMPLES / "events.jsonl"), "--out", str(out), "--audit", str(audit),
                   "--allow-policy", "window-8k"])
    assert status == 0
    expected = [json.loads(line)["request_id"] for line in (EXAMPLES / "events.jsonl").read_text().splitlines()]
    assert [p["request_id"] for p in lines(out)] == expected
    assert [a["request_id"] for a in lines(audit)] == expected


def test_assemble_collects_less_once_started(tmp_path: Path) -> None:
    """A long file is one long run: what start-up made is frozen, young objects collected
    every 10,000 allocations, as in the worker."""
    before = gc.get_threshold()
    try:
        assert main(["assemble", str(EVENTS), "--out", str(tmp_path / "p.jsonl"),
                     "--allow-policy", "window-8k"]) == 0
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


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
                     "--policy", "estimated", "--allow-policy", "window-8k"]) == 0
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


def test_a_request_may_name_only_a_policy_the_operator_allowed(tmp_path: Path) -> None:
    follow_up = naming_policy(EVENTS.read_bytes().splitlines()[-1], "window-8k")
    source = tmp_path / "in.jsonl"
    source.write_bytes(follow_up + b"\n")
    errors = tmp_path / "errors.jsonl"
    assert main(["assemble", str(source), "--out", str(tmp_path / "o"), "--errors", str(errors)]) == 1
    [record] = lines(errors)
    assert record["reason"] == "policy" and "'window-8k' is not allowed" in str(record["message"])
    assert main(["assemble", str(source), "--out", str(tmp_path / "o"), "--allow-policy", "window-8k"]) == 0
    assert main(["explain", "follow-up", "--events", str(source)]) == 2
    assert main(["explain", "follow-up", "--events", str(source), "--allow-policy", "window-8k"]) == 0
    assert main(["sweep", "follow-up", "--events", str(source), "--budgets", "500",
                 "--allow-policy", "window-8k"]) == 0


@pytest.mark.parametrize("alias", ["same", "symlink", "hardlink"])
def test_an_output_that_is_the_input_is_refused_before_anything_is_written(
        tmp_path: Path, alias: str, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(EVENTS.read_bytes())
    out = {"same": source, "symlink": tmp_path / "link.jsonl", "hardlink": tmp_path / "hard.jsonl"}[alias]
    if alias == "symlink":
        out.symlink_to(source)
    elif alias == "hardlink":
        os.link(source, out)
    assert main(["assemble", str(source), "--out", str(out)]) == 2
    assert "is the same file as the input" in capsys.readouterr().err
    assert source.read_bytes() == EVENTS.read_bytes()


def test_two_outputs_may_not_be_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"kept\n")
    assert main(["assemble", str(EVENTS), "--out", str(out), "--audit", str(out)]) == 2
    assert main(["assemble", str(EVENTS), "--audit", str(tmp_path / "new"),
                 "--errors", str(tmp_path / "." / "new")]) == 2
    assert main(["assemble", str(EVENTS), "--audit", "-"]) == 2  # prompts go to stdout too
    err = capsys.readouterr().err
    assert "--audit and --out would both write to stdout" in err
    assert out.read_bytes() == b"kept\n" and sorted(os.listdir(tmp_path)) == ["out.jsonl"]


def test_a_bom_and_an_over_long_line_in_a_file(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + event_line() + b'{"request_id": "' + b"x" * 5000 + b'"}\n')
    errors = tmp_path / "errors.jsonl"
    assert main(["assemble", str(source), "--out", os.devnull, "--errors", str(errors),
                 "--max-event-bytes", "2000"]) == 1
    [record] = lines(errors)
    assert (record["origin"], record["reason"], record["raw_bytes"]) == (f"{source}:2", "limits", 5018)
    assert record["message"] == "event is 5018 bytes, over max_event_bytes=2000"
    assert len(str(record["raw"])) == 1024 and record["raw_truncated"] is True


def test_explain_escapes_what_the_event_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(
        event_line(request_id="r\x1b[2J", chunks=[{"chunk_id": "a", "doc_id": "d\u202eoc\x9b31m", "text": "t"}])
        + json.dumps({"request_id": "r2", "question": "q", "\x1b]0;owned\x07": 1}).encode() + b"\n")
    assert main(["explain", "--events", str(source), "--policy", "estimated"]) == 0
    captured = capsys.readouterr()
    assert "request r\\x1b[2J |" in captured.out and "d\\u202eoc\\x9b31m" in captured.out
    assert "\\x1b]0;owned\\x07" in captured.err
    for text in (captured.out, captured.err):
        assert not {"\x1b", "\x07", "\u202e", "\x9b"} & set(text)


def test_explain_refuses_an_audit_of_another_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events, audit = tmp_path / "events.jsonl", tmp_path / "audit.jsonl"
    events.write_bytes(event_line())
    assert main(["assemble", str(events), "--out", os.devnull, "--audit", str(audit)]) == 0
    events.write_bytes(event_line(chunks=[{"chunk_id": c, "text": "t"} for c in "abc"]))
    assert main(["explain", "r1", "--events", str(events), "--audit", str(audit)]) == 2
    assert "does not decide exactly the 3 chunks of its event" in capsys.readouterr().err
    audit.write_text('{"request_id": 5}\n')
    assert main(["explain", "r1", "--events", str(events), "--audit", str(audit)]) == 2
    assert f"{audit}:1: not an AssemblyAudit" in capsys.readouterr().err


def test_explain_refuses_an_over_long_audit_line_by_number_without_holding_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events, audit = tmp_path / "events.jsonl", tmp_path / "audit.jsonl"
    events.write_bytes(event_line())
    assert main(["assemble", str(events), "--out", os.devnull, "--audit", str(audit)]) == 0
    bound = 1 << 20
    huge = b'{"request_id": "' + b"r" * (16 * bound) + b'"}'
    with audit.open("ab") as stream:  # an untrusted audit file: its second line is 16 MiB
        stream.write(huge + b"\n")
    tracemalloc.start()
    try:
        status = main(["explain", "r1", "--events", str(events), "--audit", str(audit),
                       "--max-event-bytes", str(bound)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert status == 2
    err = capsys.readouterr().err
    assert f"{audit}:2: the line is {len(huge)} bytes, over --max-event-bytes={bound}" in err
    assert peak < 4 * bound, f"{peak} bytes held to refuse a line of {len(huge)}"


def test_sweep_names_charts_safely_and_checks_its_budgets(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(event_line(request_id="../r/1"))
    assert main(["sweep", "--events", str(source), "--budgets", "100,200", "--png", str(tmp_path / "s.png")]) == 0
    assert (tmp_path / "s-.._r_1.png").exists()
    for budgets in ("1:x", "10:1:1", "1:5:0"):
        with pytest.raises(SystemExit, match="2"):
            main(["sweep", "--events", str(source), "--budgets", budgets])
    assert main(["assemble", "--max-event-bytes", "0"]) == 2  # a setting: refused as invalid


def test_policy_prints_the_resolved_policy_and_its_hash(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "--policy", "estimated"]) == 0
    first, *rest = capsys.readouterr().out.splitlines()
    assert first.startswith("# estimated sha256:")
    assert json.loads("\n".join(rest))["tokenizer"]["encoding"] == "chars/4"
