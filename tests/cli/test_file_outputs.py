"""What `assemble` leaves behind: complete outputs or none (SIGTERM and Ctrl-C included),
the policy records only of a run that finished, one policy per allowed name, and audits on
stdout only when the prompts go elsewhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from context_assembler.cli.main import main
from tests.factories import EXAMPLES

EVENTS = EXAMPLES / "events.jsonl"
REPO = Path(__file__).resolve().parents[2]


def wait_for(condition: str, check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"waited {seconds} s for {condition}"
        time.sleep(0.05)


def state(pid: int) -> str:
    """The process's scheduling state, as Linux reports it (R running, S asleep, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_mid_run_leaves_no_output_and_no_temporary_file(
        tmp_path: Path, signum: signal.Signals, status: int) -> None:
    events, outputs = tmp_path / "events.fifo", tmp_path / "outputs"
    os.mkfifo(events)
    outputs.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "context_assembler.cli", "assemble", str(events), "--out",
         str(outputs / "prompts.jsonl"), "--audit", str(outputs / "audit.jsonl"),
         "--errors", str(outputs / "errors.jsonl")],
        cwd=REPO, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background job
    # inherits SIGINT ignored, and Python then keeps ignoring it
    with open(events, "wb") as writer:  # the run holds the input open, mid-way through
        writer.write(EVENTS.read_bytes()[:2000])
        writer.flush()
        wait_for("the temporary outputs", lambda: len(os.listdir(outputs)) == 3)
        # Python runs a handler between bytecodes or when a blocking call is interrupted: a
        # signal that lands inside readline's C loop waits for the next input. So it is sent
        # once the run waits for more (asleep: the input is its one blocking call by then).
        wait_for("the run to wait for input", lambda: state(process.pid) == "S")
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    assert process.returncode == status, err
    assert os.listdir(outputs) == []


def test_policy_records_are_written_only_when_the_run_finishes(tmp_path: Path) -> None:
    records, out = tmp_path / "policies.jsonl", tmp_path / "out.jsonl"
    assert main(["assemble", str(EVENTS), str(tmp_path / "missing.jsonl"), "--out", str(out),
                 "--policies", str(records)]) == 2
    assert os.listdir(tmp_path) == []
    assert main(["assemble", str(EVENTS), "--out", str(out), "--policies", str(records),
                 "--allow-policy", "window-8k"]) == 0
    assert [json.loads(line)["name"] for line in records.read_text().splitlines()] == [
        "default", "window-8k"]


def test_two_allowed_policies_with_one_name_and_different_rules_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = tmp_path / "a" / "tight.toml", tmp_path / "b" / "tight.toml"
    first.write_text("[budget]\ncontext_tokens = 300\n")
    second.write_text("[budget]\ncontext_tokens = 900\n")
    out = tmp_path / "out.jsonl"
    assert main(["assemble", str(EVENTS), "--out", str(out),
                 "--allow-policy", str(first), "--allow-policy", str(second)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("context-assembler: two allowed policies are named 'tight' but hold "
                          "different rules") and "rename one" in err
    assert not out.exists()
    assert main(["assemble", str(EVENTS), "--out", str(out),  # the same rules twice: one policy
                 "--allow-policy", str(first), "--allow-policy", str(first)]) == 0


def test_audits_go_to_stdout_only_when_the_prompts_go_to_a_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prompts.jsonl"
    assert main(["assemble", str(EVENTS), "--out", str(out), "--audit", "-"]) == 0
    captured = capsys.readouterr()
    audits = [json.loads(line) for line in captured.out.splitlines()]
    prompts = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["request_id"] for a in audits] == [p["request_id"] for p in prompts]
    assert len(audits) == len(EVENTS.read_text().splitlines()) and "kept" in audits[0]
    for prompts_too in ([], ["--out", "-"]):
        assert main(["assemble", str(EVENTS), "--audit", "-", *prompts_too]) == 2
        assert capsys.readouterr().err == (
            "context-assembler: --audit and --out would both write to stdout, one kind of "
            "record mixed into the other; give one of them a file name\n")
