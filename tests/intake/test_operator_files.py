"""Operator files checked at load: a policy, tokenizer.json or policy records file that
would hang the start, exhaust memory or the stack, or load and then fail every event, stops
the CLI (exit 2) and the worker at start with one line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from context_assembler.cli.main import main
from context_assembler.engine.errors import PolicyError
from context_assembler.engine.operator_files import OperatorFileError, read_operator_file
from context_assembler.engine.policy import LARGEST_COUNT, policy_from_mapping
from context_assembler.intake.policy_registry import build_registry, load_policy
from tests.engine import trained_tokenizer
from tests.factories import EXAMPLES

EVENTS = EXAMPLES / "events.jsonl"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(args)
    return status, capsys.readouterr().err


def assert_one_line(err: str, *fragments: str) -> None:
    assert err.startswith("context-assembler: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


# Reading: regular files only, bounded in size.


def test_a_regular_file_or_a_symlink_to_one_is_read_whole(tmp_path: Path) -> None:
    (tmp_path / "data").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "data")  # as a mounted ConfigMap is
    assert read_operator_file(tmp_path / "link", "policy file", 3) == b"abc"


@pytest.mark.timeout(20)
def test_what_is_not_a_regular_file_is_refused_without_reading_or_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading would block forever
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device"),
                       (tmp_path, "a directory")):
        with pytest.raises(OperatorFileError, match=f"policy file {path}: is {kind}, not a regular"):
            read_operator_file(path, "policy file", 1024)


def test_a_file_over_its_limit_or_a_nul_in_its_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 2049)
    with pytest.raises(OperatorFileError, match="big: larger than its limit of 2,048 bytes"):
        read_operator_file(tmp_path / "big", "policy file", 2048)
    with pytest.raises(OperatorFileError, match="cannot hold a NUL"):
        read_operator_file("a\0b", "policy file", 2048)
    with pytest.raises(OperatorFileError, match="missing: cannot read it \\(No such file"):
        read_operator_file(tmp_path / "missing", "policy file", 2048)


# Policy files.


@pytest.mark.parametrize("nested", [
    "a = " + "[" * 5000 + "]" * 5000,  # far past Python's stack
    "a = " + "{b = " * 5000 + "1" + "}" * 5000,
    "a = " + "[" * 17 + "]" * 17,  # just past the limit
])
def test_a_deeply_nested_policy_file_is_a_policy_error(tmp_path: Path, nested: str) -> None:
    policy = tmp_path / "deep.toml"
    policy.write_text(nested + "\n")
    with pytest.raises(PolicyError, match=r"deep\.toml: nested deeper than 16 levels"):
        load_policy(str(policy))


def test_nesting_within_the_limit_is_left_to_the_policy_model(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text("[render]\nlabels = " + "[" * 15 + "]" * 15 + "\n")
    with pytest.raises(PolicyError, match=r"render\.labels"):
        load_policy(str(policy))


def test_a_policy_file_that_is_not_utf8_is_a_policy_error(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(PolicyError, match=r"p\.toml: not UTF-8"):
        load_policy(str(policy))


@pytest.mark.parametrize(("section", "key"), [
    ("budget", "context_tokens"), ("budget", "window"), ("budget", "max_output"),
    ("budget", "safety_tokens"), ("budget", "message_overhead"), ("select", "max_chunks"),
    ("compress", "max_sentences"),
])
def test_every_policy_count_is_bounded(section: str, key: str) -> None:
    window = {"window": LARGEST_COUNT} if key == "max_output" else {}
    overrides = {section: {key: LARGEST_COUNT - (key == "max_output"), **window}}
    assert policy_from_mapping(overrides).hash  # the largest count is a usable policy
    with pytest.raises(PolicyError, match=f"{section}.{key}: Input should be less than or equal"):
        policy_from_mapping({section: {key: 2**64}})


def test_a_count_over_64_bits_stops_the_cli_at_start(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy, out = tmp_path / "big.toml", tmp_path / "out.jsonl"
    policy.write_text("[budget]\ncontext_tokens = 99999999999999999999999\n")
    status, err = run_cli(["policy", "--policy", str(policy)], capsys)
    assert status == 2
    assert_one_line(err, "budget.context_tokens: Input should be less than or equal to 2147483647")
    status, err = run_cli(["assemble", str(EVENTS), "--policy", str(policy), "--out", str(out)],
                          capsys)
    assert status == 2 and not out.exists()  # refused at start, not as 7 engine errors


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("encoding", "expected"), [
    ("hf:a\0b", "a file name cannot hold a NUL"),
    ("hf:/dev/zero", "tokenizer file /dev/zero: is a character device, not a regular file"),
    ("hf:fifo.json", "fifo.json: is a FIFO, not a regular file"),
    ("hf:deep.json", "is not a Hugging Face tokenizer.json"),
])
def test_a_tokenizer_path_that_is_not_a_file_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], encoding: str, expected: str) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "deep.json").write_text("[" * 5000 + "]" * 5000)
    policy = tmp_path / "policy.toml"
    toml_string = encoding.replace("\0", "\\u0000")  # TOML's escape for the NUL
    policy.write_text(f'[tokenizer]\nencoding = "{toml_string}"\n')
    status, err = run_cli(["policy", "--policy", str(policy)], capsys)
    assert status == 2
    assert_one_line(err, "[tokenizer] encoding", expected)


@pytest.mark.timeout(30)
def test_a_policy_or_records_file_that_is_not_a_file_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "fifo")
    for path in ("/dev/zero", str(tmp_path / "fifo")):
        status, err = run_cli(["policy", "--policy", path], capsys)
        assert status == 2
        assert_one_line(err, f"policy file {path}: is a")
        status, err = run_cli(["policy", "--policies", path, "--diff", "a", "b"], capsys)
        assert status == 2
        assert_one_line(err, f"policy records file {path}: is a")


def test_a_records_file_nested_past_the_json_parsers_limit_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = tmp_path / "policies.jsonl"
    records.write_text('{"settings": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    status, err = run_cli(["policy", "--policies", str(records), "--diff", "a", "b"], capsys)
    assert status == 2
    assert_one_line(err, "policies.jsonl:1: not a policy record", "recursion limit exceeded")


# Tokenizers that load and cannot count every text.


def word_level(folder: Path, unknown: str | None) -> Path:
    vocab = {"the": 0, "pump": 1, **({unknown: 2} if unknown else {})}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unknown or "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return save(folder, tokenizer)


def unigram(folder: Path) -> Path:
    pieces = [(c, -1.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    return save(folder, Tokenizer(models.Unigram(pieces, unk_id=None)))


def save(folder: Path, tokenizer: Tokenizer) -> Path:
    tokenizer.save(str(folder / "tokenizer.json"))
    policy = folder / "policy.toml"
    policy.write_text('name = "model"\n[tokenizer]\nencoding = "hf:tokenizer.json"\n')
    return policy


@pytest.mark.parametrize("make", [lambda folder: word_level(folder, None), unigram],
                         ids=["word-level", "unigram"])
def test_a_tokenizer_without_an_unknown_token_is_refused_at_load(
        tmp_path: Path, make: Callable[[Path], Path], capsys: pytest.CaptureFixture[str]) -> None:
    policy = make(tmp_path)
    with pytest.raises(PolicyError, match="cannot encode text outside its vocabulary"):
        build_registry(str(policy))
    with pytest.raises(PolicyError, match="unk_token"):
        build_registry(None, [str(policy)])
    out = tmp_path / "out.jsonl"
    status, err = run_cli(["assemble", str(EVENTS), "--policy", str(policy), "--out", str(out)],
                          capsys)
    assert status == 2 and not out.exists()
    assert_one_line(err, "cannot encode text outside its vocabulary")


def test_the_worker_refuses_to_start_under_such_a_tokenizer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from context_assembler.kafka.runtime import worker as run
    from context_assembler.observability import logs
    from context_assembler.settings import Settings

    monkeypatch.setattr(logs, "configure", lambda level: None)  # keep pytest's log capture
    monkeypatch.setattr(run, "EventRunner", None)  # joining would call it: it must not be reached
    assert run.run_worker(Settings(policy_file=str(unigram(tmp_path)))) == 2
    assert "cannot start" in caplog.text and "cannot encode text outside" in caplog.text


def test_tokenizers_that_can_count_any_text_load(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with_unknown = build_registry(str(word_level(tmp_path / "a", "[UNK]"))).default
    trained_tokenizer.save(tmp_path / "b", family="metaspace")  # BPE with <unk>
    (tmp_path / "b" / "policy.toml").write_text('[tokenizer]\nencoding = "hf:tokenizer.json"\n')
    metaspace = build_registry(str(tmp_path / "b" / "policy.toml")).default
    assert with_unknown.tokenizer.encoding.startswith("hf:sha256:")
    assert metaspace.tokenizer.encoding.startswith("hf:sha256:")
