"""A policy file that names a model's tokenizer.json (`encoding = "hf:PATH"`) or a model
(`model = "gpt-4o"`): resolved at start, covered by the policy hash, and a clear error at
start (never per event) when the file is missing or broken."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from context_assembler.cli.main import main
from context_assembler.contract.models import RetrievalResult
from context_assembler.engine import assemble
from context_assembler.engine.errors import ContextAssemblerError, PolicyError
from context_assembler.intake.policy_registry import build_registry, load_policy
from tests.engine import trained_tokenizer
from tests.factories import EXAMPLES, example_events

HF_POLICY = """name = "our-model"
[tokenizer]
encoding = "hf:{path}"
[budget]
window = 1200
max_output = 200
"""


def policy_file(folder: Path, path: str = "tokenizer.json") -> Path:
    policy = folder / "policy.toml"
    policy.write_text(HF_POLICY.format(path=path), "utf-8")
    return policy


def test_the_file_is_found_beside_the_policy_and_named_by_its_content(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    tokenizer = trained_tokenizer.save(tmp_path / "models", family="metaspace")
    policy = load_policy(str(policy_file(tmp_path, "models/tokenizer.json")))  # not the cwd
    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest()
    assert policy.tokenizer.encoding == f"hf:sha256:{digest}" == policy.tokenizer.exact_encoding


def test_every_context_and_prompt_recounts_with_the_same_file(tmp_path: Path) -> None:
    path = trained_tokenizer.save(tmp_path)
    registry = build_registry(str(policy_file(tmp_path)))
    library = Tokenizer.from_file(str(path))

    def count(text: str) -> int:
        return len(library.encode(text, add_special_tokens=False).ids)

    policy = registry.default
    for raw in example_events().values():
        result = assemble(RetrievalResult.model_validate(raw), policy)
        prompt, audit = result.prompt, result.audit
        assert prompt.tokens.tokenizer == policy.tokenizer.encoding
        assert count(prompt.context) <= prompt.tokens.budget
        overhead = policy.budget.message_overhead
        assert prompt.tokens.prompt == sum(count(m.content) + overhead for m in prompt.messages)
        assert prompt.tokens.prompt <= 1200 - 200
        assert len(audit.kept) + len(audit.dropped) == len(raw["chunks"])


def test_the_hash_follows_the_files_content_not_its_place(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    trained_tokenizer.save(tmp_path / "a")
    first = load_policy(str(policy_file(tmp_path / "a")))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert load_policy(str(tmp_path / "b" / "policy.toml")).hash == first.hash  # same content
    trained_tokenizer.save(tmp_path / "b", vocab_size=300)  # the model's vocabulary changed
    changed = load_policy(str(tmp_path / "b" / "policy.toml"))
    assert changed.hash != first.hash
    assert changed.tokenizer.encoding != first.tokenizer.encoding


def test_a_model_name_in_a_policy_file(tmp_path: Path) -> None:
    policy = tmp_path / "gpt.toml"
    policy.write_text('[tokenizer]\nmodel = "gpt-4o"\n', "utf-8")
    tokenizer = load_policy(str(policy)).tokenizer
    assert (tokenizer.encoding, tokenizer.exact_encoding) == ("o200k_base", "o200k_base")
    policy.write_text('[tokenizer]\nmodel = "gpt-4o"\nencoding = "hf:tokenizer.json"\n', "utf-8")
    trained_tokenizer.save(tmp_path)
    with pytest.raises(PolicyError, match="counts with o200k_base, but encoding = 'hf:sha256:"):
        load_policy(str(policy))


@pytest.mark.parametrize(("content", "message"), [
    (None, r"policy\.toml: \[tokenizer\] encoding = 'hf:tokenizer\.json': tokenizer file .*tokenizer\.json: cannot read it"),
    (b"<html>not found</html>", r"is not a Hugging Face tokenizer\.json"),
    (b'{"version": "1.0", "model": {"type": "BPE"}}', r"is not a Hugging Face tokenizer\.json"),
])
def test_a_missing_or_broken_file_stops_the_start(tmp_path: Path, content: bytes | None, message: str) -> None:
    if content is not None:
        (tmp_path / "tokenizer.json").write_bytes(content)
    policy = policy_file(tmp_path)
    with pytest.raises(PolicyError, match=message) as raised:
        build_registry(str(policy))  # what the CLI and the Kafka worker call before anything else
    assert isinstance(raised.value, ContextAssemblerError) and "\n" not in str(raised.value)
    with pytest.raises(PolicyError, match=message):
        build_registry(None, [str(policy)])  # an allowed policy too


def test_a_request_may_name_an_allowed_tokenizer_json_policy(tmp_path: Path) -> None:
    trained_tokenizer.save(tmp_path)
    registry = build_registry(None, [str(policy_file(tmp_path))])  # exact: not refused as estimate
    assert registry.resolve("our-model").tokenizer.encoding.startswith("hf:sha256:")


def test_the_cli_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = policy_file(tmp_path)
    out = tmp_path / "prompts.jsonl"
    status = main(["assemble", str(EXAMPLES / "events.jsonl"), "--policy", str(policy), "--out", str(out)])
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith("context-assembler: ") and err.count("\n") == 1
    assert "tokenizer file" in err and "cannot read it" in err
    assert not out.exists()  # stopped at start, not one rejection per event


def test_the_worker_exits_before_joining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    from context_assembler.kafka.runtime import worker as run
    from context_assembler.observability import logs
    from context_assembler.settings import Settings

    monkeypatch.setattr(logs, "configure", lambda level: None)  # keep pytest's log capture
    monkeypatch.setattr(run, "EventRunner", None)  # joining would call it: it must not be reached
    assert run.run_worker(Settings(policy_file=str(policy_file(tmp_path)))) == 2
    assert "cannot start" in caplog.text and "tokenizer file" in caplog.text
