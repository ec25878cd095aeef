"""Every shell block of README.md and docs/ that a test machine can run, run as a new user
pastes it: alone, in a fresh bash from the repository's directory after `make demo`, each
command exiting as the page says and printing what the page shows (tests/support/doc_blocks.py
says how a page shows output).

The blocks on the development broker run in one session, in
tests/integration/test_first_run.py; tests/test_docs.py lists the blocks no test machine can
run (a cluster, a Docker engine, minutes of benchmark) and what checks them instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.doc_blocks import (
    block_id,
    fresh_shell_env,
    needs_the_broker,
    one_at_a_time,
    problems,
    run_block,
    runnable_blocks,
)
from tests.support.docs import Block
from tests.test_docs import CHECKED

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
BLOCKS = [block for block in runnable_blocks(CHECKED) if not needs_the_broker(block)]


@pytest.mark.parametrize("block", BLOCKS, ids=block_id)
def test_the_block_runs_pasted_alone_and_prints_what_the_page_shows(block: Block) -> None:
    (REPO / "out").mkdir(exist_ok=True)  # as `make demo` leaves it
    with one_at_a_time():
        run = run_block(block, fresh_shell_env())
    found = problems(run)
    assert not found, f"{block_id(block)}:\n" + "\n\n".join(found)


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
