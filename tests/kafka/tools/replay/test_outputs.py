"""A replay's output files (whole or not at all) and its progress bar."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from context_assembler.intake.codec import encode
from context_assembler.kafka.records import Origin, handle
from context_assembler.kafka.tools.replay.outputs import OutputFiles, Progress, output_files
from tests.kafka.test_records import CONTEXT, GOOD

ORIGIN = Origin("retrieval.results", 3, 1187, b"k", (), 1_764_547_200_000)


def paths(folder: Path) -> tuple[Path, Path, Path]:
    return folder / "prompts.jsonl", folder / "audit.jsonl", folder / "errors.jsonl"


def test_prompts_audits_and_error_records_are_written_as_the_file_mode_writes_them(
    tmp_path: Path,
) -> None:
    good, bad = handle(GOOD, ORIGIN, CONTEXT), handle(b"{bad", ORIGIN, CONTEXT)
    with output_files(*paths(tmp_path)) as files:
        files.write(good, ORIGIN, GOOD)
        files.write(bad, ORIGIN, b"{bad")
    prompts, audits, errors = (p.read_bytes() for p in paths(tmp_path))
    assert good.assembly is not None and bad.rejected is not None
    assert prompts == encode(good.assembly.prompt) + b"\n"
    assert audits == encode(good.assembly.audit) + b"\n"
    assert errors == encode(bad.rejected.record("retrieval.results/3/1187", b"{bad")) + b"\n"
    assert json.loads(errors)["reason"] == "json"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "audit.jsonl", "errors.jsonl", "prompts.jsonl"]  # no temporary file left


def test_files_not_asked_for_are_not_written(tmp_path: Path) -> None:
    prompts, _, _ = paths(tmp_path)
    with output_files(prompts, None, None) as files:
        assert files.audits is None and files.errors is None
        files.write(handle(GOOD, ORIGIN, CONTEXT), ORIGIN, GOOD)
        files.write(handle(b"{bad", ORIGIN, CONTEXT), ORIGIN, b"{bad")
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.jsonl"]
    OutputFiles().write(handle(GOOD, ORIGIN, CONTEXT), ORIGIN, GOOD)  # none at all: a no-op


def test_a_failed_replay_leaves_no_file_and_the_old_ones_as_they_were(tmp_path: Path) -> None:
    prompts, audits, errors = paths(tmp_path)
    audits.write_bytes(b"yesterday's\n")
    with pytest.raises(ConnectionError), output_files(prompts, audits, errors) as files:
        files.write(handle(GOOD, ORIGIN, CONTEXT), ORIGIN, GOOD)
        raise ConnectionError("the broker went away")
    assert [p.name for p in tmp_path.iterdir()] == ["audit.jsonl"]
    assert audits.read_bytes() == b"yesterday's\n"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only() -> None:
    terminal = Terminal()
    progress = Progress(2, terminal)
    progress.step()
    progress.step()
    progress.close()
    shown = terminal.getvalue()
    assert shown.startswith("\r[") and "2/2" in shown and "events/s ETA" in shown
    assert shown.endswith("\n") and "#" * 30 in shown

    piped = io.StringIO()
    progress = Progress(2, piped)
    progress.step()
    progress.close()
    assert piped.getvalue() == ""
