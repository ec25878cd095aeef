"""docs/generation.md as written: each provider block runs from the repository's root,
its SDK pointed at a loopback server of the test's own through the variables the SDK reads
(no network beyond 127.0.0.1), and sends the request the prompt carries; the citation
blocks print what the page says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

import context_assembler as ca
from context_assembler.engine import policy_from_mapping
from context_assembler.intake.codec import encode
from tests.support.doc_blocks import fresh_shell_env, one_at_a_time, problems, run_block
from tests.support.docs import REPO, Block, section_blocks
from tests.support.loopback import provider_server

PAGE = "docs/generation.md"
EVENT = REPO / "examples" / "event.json"


def python_block(heading: str) -> Block:
    (block,) = [b for b in section_blocks(PAGE, heading) if b.language == "python"]
    return block


def run_python(block: Block, url: str = "http://127.0.0.1:9") -> subprocess.CompletedProcess[str]:
    """The block as a reader runs it, the SDKs' variables naming the loopback server."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ASSEMBLER_", "OPENAI_", "ANTHROPIC_", "CO_"))}
    env |= {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "test-key",
            "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "test-key",
            "CO_API_URL": url, "CO_API_KEY": "test-key"}
    return subprocess.run([sys.executable, "-c", block.text], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


def published(form: str) -> dict[str, Any]:
    event = ca.RetrievalResult.model_validate_json(EVENT.read_text("utf-8"))
    prompt = ca.assemble(event, policy_from_mapping({"render": {"format": form}})).prompt
    decoded: dict[str, Any] = json.loads(encode(prompt))
    return decoded


@pytest.mark.parametrize(("heading", "form", "path", "settings"), [
    ("## OpenAI Chat Completions: the messages", "messages", "/chat/completions", {}),
    ("## Anthropic Messages: search results", "anthropic", "/v1/messages",
     {"max_tokens": 1024}),
    ("## Cohere Chat v2: documents", "cohere", "/v2/chat", {"stream": False}),
])
def test_each_provider_block_sends_the_request_the_prompt_carries(
    heading: str, form: str, path: str, settings: dict[str, Any]
) -> None:
    with provider_server() as server:
        result = run_python(python_block(heading), server.url)
    assert result.returncode == 0, result.stderr
    (sent,) = server.requests
    assert sent.path == path
    body = sent.json()
    assert isinstance(body.pop("model"), str)
    prompt = published(form)
    request = prompt.get("provider_request") or {"messages": prompt["messages"]}
    assert body == {**settings, **request}
    printed = result.stdout.strip().splitlines()
    if form == "messages":
        assert printed == ["Three years.", "[]"]  # the answer, and no label invented
    else:  # the SDK's parsed response, read by the citation check: the canned citation
        check = json.loads(printed[-1])
        assert [cited["label"] for cited in check["cited"]] == ["wp-2-periods"]
        assert check["invented"] == []


def test_the_citation_block_prints_what_the_page_says() -> None:
    result = run_python(python_block("## Check the citations"))
    assert result.returncode == 0, result.stderr
    said = "['wp-2-periods'] ['S9'] ['pw2400-winter', 'pw2400-safety']"
    assert result.stdout.strip() == said
    assert f"It prints `{said}`" in (REPO / PAGE).read_text("utf-8")


def test_the_citations_command_block_runs_as_shown() -> None:
    (block,) = [b for b in section_blocks(PAGE, "### From the command line") if b.is_shell]
    (REPO / "out").mkdir(exist_ok=True)  # as `make demo` leaves it
    with one_at_a_time():
        run = run_block(block, fresh_shell_env())
    assert not problems(run), problems(run)
    checks = [json.loads(line)
              for line in (REPO / "out" / "citations.jsonl").read_text("utf-8").splitlines()]
    answers = (REPO / "examples" / "answers.jsonl").read_text("utf-8").splitlines()
    assert [check["request_id"] for check in checks] == [
        json.loads(answer)["request_id"] for answer in answers]
    assert [[c["label"] for c in check["cited"]] for check in checks] == [
        ["wp-2-periods"], ["wp-2-periods"], ["pw2400-parts"]]
    assert [check["invented"] for check in checks] == [[], ["S4"], ["nope-1"]]
    assert "checked 3, rejected 0" in run.output

