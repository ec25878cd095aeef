"""main(): the project's errors in one line with exit status 2, Ctrl-C 130, anything else a
bug (70, its traceback only with --debug)."""

from __future__ import annotations

import concurrent.futures
import errno
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from context_assembler import filemode
from context_assembler.cli import files
from context_assembler.cli.main import main
from context_assembler.engine import vocabulary
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.tokens import _tiktoken_counter
from tests.factories import EXAMPLES

EVENTS = EXAMPLES / "events.jsonl"


def test_a_broken_policy_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text('[select]\npacking = "greedy"\n')
    assert main(["assemble", str(EXAMPLES / "events.jsonl"), "--policy", str(policy)]) == 2
    assert "select.packing" in capsys.readouterr().err

@pytest.mark.parametrize(
    ("raised", "status", "message"),
    [
        (ContextAssemblerError("bad \x1b[2J policy"), 2, "context-assembler: bad \\x1b[2J policy\n"),
        (OSError(errno.EACCES, "Permission denied"), 2, "context-assembler: [Errno 13] Permission denied\n"),
        (LookupError("gone"), 70, "context-assembler: LookupError: gone (this is a bug; please report it"),
    ],
)
def test_main_reports_the_projects_errors_and_calls_the_rest_bugs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        raised: Exception, status: int, message: str) -> None:
    def load_policy(spec: str | None) -> None:
        raise raised

    monkeypatch.setattr(files, "load_policy", load_policy)
    assert main(["policy"]) == status
    assert capsys.readouterr().err.startswith(message)


def test_a_request_or_a_file_that_is_not_there_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "missing", "--events", str(EVENTS)]) == 2
    assert capsys.readouterr().err == f"context-assembler: request 'missing' is not in {EVENTS}\n"
    missing, folder = tmp_path / "missing.jsonl", tmp_path / "no" / "out.jsonl"
    assert main(["assemble", str(missing), "--out", os.devnull]) == 2
    assert f"No such file or directory: '{missing}'" in capsys.readouterr().err
    assert main(["assemble", str(EVENTS), "--out", str(folder)]) == 2
    assert f"No such file or directory: '{folder}'" in capsys.readouterr().err
    assert main(["explain", "q30-staff", "--events", str(EVENTS), "--audit", str(tmp_path)]) == 2
    assert f"Is a directory: '{tmp_path}'" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_an_output_that_cannot_be_written_is_an_error_not_a_bug(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(EVENTS.read_bytes().splitlines()[0] + b"\n")
    assert main(["assemble", str(source), "--out", "/dev/full"]) == 2
    assert capsys.readouterr().err == "context-assembler: [Errno 28] No space left on device\n"


def test_an_interrupted_run_leaves_the_old_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"old\n")

    def interrupted(*args: object, prompts: io.BytesIO, **kwargs: object) -> None:
        prompts.write(b"half a line")
        raise KeyboardInterrupt

    monkeypatch.setattr(filemode, "run", interrupted)
    assert main(["assemble", str(EVENTS), "--out", str(out)]) == 130
    assert out.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["out.jsonl"]


def test_a_bug_is_one_line_unless_debugging(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*args: object) -> None:
        raise KeyError(41)

    monkeypatch.setattr(files, "decision_table", broken)
    command = ["explain", "q30-staff", "--events", str(EVENTS), "--policy", "estimated"]
    assert main(command) == 70
    err = capsys.readouterr().err
    assert "KeyError: 41 (this is a bug; please report it" in err and "Traceback" not in err
    assert main(["--debug", *command]) == 70
    assert "Traceback" in capsys.readouterr().err


def test_a_missing_vocabulary_stops_the_command_before_reading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(vocabulary, "_bundled", lambda name: None)
    _tiktoken_counter.cache_clear()
    try:
        assert main(["assemble", "--out", str(tmp_path / "o"), str(tmp_path / "missing")]) == 2
    finally:
        _tiktoken_counter.cache_clear()  # the next test loads the real vocabulary again
    err = capsys.readouterr().err
    assert "context-assembler: tokenizer vocabulary 'cl100k_base' is not available offline" in err
    assert not (tmp_path / "o").exists()


def run_without(stream: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` started with one standard stream closed (`<&-`, `>&-` or `2>&-`)."""
    redirect = {"stdin": "<&-", "stdout": ">&-", "stderr": "2>&-"}[stream]
    return subprocess.run(["sh", "-c", f'exec "$0" "$@" {redirect}', sys.executable, *args],
                          capture_output=True, stdin=subprocess.DEVNULL, text=True, timeout=120)


@pytest.mark.parametrize(
    ("stream", "args"),
    [("stdin", ["assemble"]), ("stdout", ["assemble", str(EVENTS)]),
     ("stdout", ["explain", "--events", str(EVENTS)])],
)
def test_a_closed_stream_the_command_needs_is_named_with_status_2(
    stream: str, args: list[str]
) -> None:
    done = run_without(stream, "-m", "context_assembler.cli", *args)
    assert done.returncode == 2
    assert done.stderr == (f"context-assembler: {stream} is closed (the command was started "
                           "without it); open it, or name a file instead\n")


def test_with_stderr_closed_nothing_but_outputs_reaches_stdout(tmp_path: Path) -> None:
    refused = run_without("stderr", "-m", "context_assembler.cli", "assemble", str(EVENTS))
    assert (refused.returncode, refused.stdout) == (2, "")  # error records go to stderr
    events, errors = tmp_path / "events.jsonl", tmp_path / "errors.jsonl"
    events.write_text(EVENTS.read_text() + "not json\n")
    done = run_without("stderr", "-m", "context_assembler.cli", "assemble", str(events),
                       "--errors", str(errors))
    assert done.returncode == 1  # as with stderr open: the last line is refused
    assert [json.loads(line)["request_id"] for line in done.stdout.splitlines()] == [
        json.loads(line)["request_id"] for line in EVENTS.read_text().splitlines()]
    assert [json.loads(line)["origin"] for line in errors.read_text().splitlines()] == [
        f"{events}:{len(EVENTS.read_text().splitlines()) + 1}"]


def test_a_file_opened_with_stdout_closed_does_not_take_its_number(tmp_path: Path) -> None:
    out = tmp_path / "fd"
    opens = ("import os\nfrom context_assembler.cli.common import stand_in_for_closed_streams\n"
             "stand_in_for_closed_streams()\n"
             f"fd = os.open({str(out)!r}, os.O_WRONLY | os.O_CREAT)\n"
             "os.write(fd, str(fd).encode())\n")
    assert run_without("stdout", "-c", opens).returncode == 0
    assert int(out.read_text()) > 2


def test_main_runs_outside_the_main_thread_without_taking_its_signals(tmp_path: Path) -> None:
    """Tests and embedders call main() from a thread, where signal.signal raises."""
    out = tmp_path / "prompts.jsonl"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(main, ["assemble", str(EVENTS), "--out", str(out)]).result() == 0
    assert len(out.read_text().splitlines()) == len(EVENTS.read_text().splitlines())
