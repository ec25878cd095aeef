"""The README's blocks for a first hour run as a new user pastes them, taken from README.md.

The worker block and the debugging walkthrough need a broker: scripts/quickstart.sh runs
them (tests/integration/test_first_run.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def readme_blocks(heading: str) -> list[str]:
    """The fenced blocks of the README section under `heading`, up to the next heading."""
    blocks: list[str] = []
    inside = fenced = False
    for line in (REPO / "README.md").read_text("utf-8").splitlines():
        if not fenced and line == heading:
            inside = True
        elif inside and not fenced and line.startswith("#"):
            break
        elif inside and line.startswith("```"):
            fenced = not fenced
            if fenced:
                blocks.append("")
        elif inside and fenced:
            blocks[-1] += line + "\n"
    return blocks


def run_block(block: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ASSEMBLER_", "VIRTUAL_ENV"))}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_http_block_answers_with_a_prompt_and_an_audit() -> None:
    (block,) = readme_blocks("## HTTP endpoint")
    result = run_block(block)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)
    assert answer["prompt"]["request_id"] == answer["audit"]["request_id"] == "q30-customer"
    assert '"level": "ERROR"' not in result.stderr


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
