"""The file side of recorded policies: `assemble --policies F` and `policy --diff` over F."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from context_assembler.cli.main import main
from context_assembler.engine.version import __version__
from context_assembler.intake.policy_registry import build_registry
from context_assembler.intake.recorded_policies import read_records
from tests.factories import EXAMPLES, naming_policy


def test_assemble_writes_the_records_the_worker_would_publish(tmp_path: Path) -> None:
    records, source = tmp_path / "policies.jsonl", tmp_path / "events.jsonl"
    examples = (EXAMPLES / "events.jsonl").read_bytes().splitlines()
    source.write_bytes(b"\n".join([*examples, naming_policy(examples[-1], "window-8k")]))
    status = main(["assemble", str(source), "--allow-policy", "window-8k",
                   "--out", str(tmp_path / "p.jsonl"), "--policies", str(records)])
    assert status == 0
    lines = records.read_bytes().splitlines()
    registry = build_registry(None, ["window-8k"])
    assert [json.loads(line)["hash"] for line in lines] == [
        registry.default.hash, registry.resolve("window-8k").hash]
    # Every prompt's hash is recorded.
    prompts = (tmp_path / "p.jsonl").read_bytes().splitlines()
    recorded = read_records(lines, str(records))
    for prompt in map(json.loads, prompts):
        assert recorded.policy(prompt["policy"]["hash"]).name == prompt["policy"]["name"]


def test_policy_diff_shows_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = tmp_path / "policies.jsonl"
    tight = tmp_path / "tight.toml"
    tight.write_text("[budget]\ncontext_tokens = 300\n")
    main(["assemble", "--policy", str(tight), "--allow-policy", "default", "--out", "/dev/null",
          "--policies", str(records), str(EXAMPLES / "events.jsonl")])
    tight_hash, default_hash = (json.loads(line)["hash"] for line in records.read_bytes().splitlines())
    capsys.readouterr()
    assert main(["policy", "--diff", default_hash, tight_hash.removeprefix("sha256:"),
                 "--policies", str(records)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"--- default {default_hash} (engine {__version__})",
        f"+++ tight {tight_hash} (engine {__version__})",
        "budget.context_tokens: 1500 -> 300",
    ]
    assert main(["policy", "--diff", default_hash, default_hash, "--policies", str(records)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "no setting differs"
    assert main(["policy", "--diff", default_hash, "sha256:0000", "--policies", str(records)]) == 2
    assert f"policy sha256:0000 is not recorded in {records}" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["assemble", "--policies", "-"], "--policies needs a file name"),
    (["replay", "--policies", "f.jsonl", "--from", "0:0"], "--policies goes with --policy recorded"),
])
def test_misused_options_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err
