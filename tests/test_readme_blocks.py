"""The blocks of the README and the docs for a first hour, run as a new user pastes them,
taken from the pages themselves.

The worker block and the walkthroughs that need a broker are run by scripts/quickstart.sh
(tests/integration/test_first_run.py); tests/test_docs.py checks that every shell block of
the pages is run here, there, or checked another way.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.docs import section_blocks

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def shell_block(document: str, heading: str) -> str:
    """The one shell block of the section under `heading` in `document`."""
    (block,) = [b.text for b in section_blocks(document, heading) if b.is_shell]
    return block


def run_block(block: str, *, activated: bool = False) -> subprocess.CompletedProcess[str]:
    """`block` in bash from the repository's directory, after `make demo` (which creates
    .venv and out/); with `activated`, as in a shell where `. .venv/bin/activate` ran."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ASSEMBLER_", "VIRTUAL_ENV"))}
    if activated:
        env["PATH"] = f"{REPO / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    (REPO / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_quick_start_demo_runs_as_shown() -> None:
    """`make demo`, the first line of the quick start (its `make test` is what CI runs)."""
    block = shell_block("README.md", "## Quick start")
    assert shell_block("docs/getting-started.md", "## Quick start") == block
    demo, tests = block.splitlines()
    assert tests.startswith("make test ")
    env = {**os.environ, "MAKEFLAGS": "-o .venv/bin/context-assembler"}  # this venv, as it is
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", demo], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "request q30-customer | policy service (sha256:" in result.stdout
    assert "dropped: access_denied: audience 'customer' is not in ['staff']" in result.stdout
    assert (REPO / "out" / "sweep-q30.png").is_file()


def test_the_file_mode_blocks_run_as_shown() -> None:
    events = (EXAMPLES / "events.jsonl").read_text("utf-8").splitlines()
    readme = run_block(shell_block("README.md", "### File mode"))
    assert readme.returncode == 0, readme.stderr
    assert len((REPO / "out" / "prompts.jsonl").read_text("utf-8").splitlines()) == len(events)
    assert (REPO / "out" / "errors.jsonl").read_text("utf-8") == ""

    guide = run_block(shell_block("docs/getting-started.md", "## Assemble your own events"))
    assert guide.returncode == 0, guide.stderr
    audits = [json.loads(line)
              for line in (REPO / "out" / "audit.jsonl").read_text("utf-8").splitlines()]
    assert [audit["request_id"] for audit in audits] == [
        json.loads(event)["request_id"] for event in events]
    assert "request q30-customer | policy service (sha256:" in guide.stdout  # explain
    assert "# service sha256:" in guide.stdout  # policy: the resolved rules and their hash


def test_the_http_block_answers_with_a_prompt_and_an_audit() -> None:
    block = shell_block("docs/http-api.md", "## Try it")
    assert shell_block("README.md", "### HTTP endpoint") == block
    result = run_block(block)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)
    assert answer["prompt"]["request_id"] == answer["audit"]["request_id"] == "q30-customer"
    assert '"level": "ERROR"' not in result.stderr


def test_the_acls_block_prints_kafka_acls_commands() -> None:
    result = run_block(shell_block("docs/secured-cluster.md", "## Least privilege: the ACLs"),
                       activated=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("kafka-acls --bootstrap-server ") for line in lines)
    assert all("--allow-principal User:context-assembler" in line for line in lines)


def test_the_single_example_event_is_an_example_of_events_jsonl() -> None:
    event = (EXAMPLES / "event.json").read_bytes().rstrip(b"\n")
    assert event in (EXAMPLES / "events.jsonl").read_bytes().splitlines()


def test_every_shipped_example_is_assembled_under_the_defaults(tmp_path: Path) -> None:
    """No example names a policy the operator must allow first: `assemble`, `serve` and the
    worker accept them all as they are configured out of the box."""
    errors = tmp_path / "errors.jsonl"
    result = subprocess.run(
        [str(REPO / ".venv/bin/context-assembler"), "assemble", "examples/events.jsonl",
         "--out", str(tmp_path / "prompts.jsonl"), "--errors", str(errors)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert (result.returncode, errors.read_text()) == (0, "")


def test_the_evaluate_block_measures_the_shipped_questions() -> None:
    """The quality page's `evaluate` block, on the NQ-open sample the repository ships."""
    chart = REPO / "out" / "quality.png"
    chart.unlink(missing_ok=True)
    result = run_block(shell_block("docs/quality.md", "## Measure your own questions"))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "323 questions"
    rows = {tuple(line.split()[:2]): line.split() for line in lines[2:] if line[:1] != "c"}
    assert {name for name, _ in rows} == {"top-k", "default", "focused"}
    for budget in ("600", "1200"):  # answer kept, as a percentage: focused well ahead
        assert float(rows[("focused", budget)][2]) > float(rows[("default", budget)][2]) + 30
    assert chart.read_bytes().startswith(b"\x89PNG")
