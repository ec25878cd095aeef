"""The one settings model: every command reads it, flags over variables over defaults."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import annotated_types
import pytest

from context_assembler.cli.common import read_settings
from context_assembler.cli.main import build_parser, main
from context_assembler.cli.settings_flags import COMMANDS, command_flag
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.generate.settings_reference import reference
from context_assembler.intake.codec import Limits
from context_assembler.settings import (
    Settings,
    SettingsError,
    flag_of,
    load_settings,
    variable_of,
)
from tests.factories import EXAMPLES

REPO = Path(__file__).resolve().parent.parent
# Each command as typed, with what it needs to parse (`command` -> its argv up to the flags).
ARGV = {
    "assemble": ["assemble"], "explain": ["explain"], "sweep": ["sweep"], "worker": ["worker"],
    "evaluate": ["evaluate", "questions.jsonl", "--policy", "focused"],
    "acls": ["acls", "--principal", "User:a"], "topics": ["topics"],
    "topics create": ["topics", "create"],
    "produce": ["produce"], "tail": ["tail", "prompts"], "replay": ["replay"],
    "serve": ["serve"], "policy": ["policy"], "redrive": ["redrive"],
    "citations": ["citations", "--prompts", "p.jsonl", "--answers", "a.jsonl"],
    "schemas register": ["schemas", "register"],
}
# The documented flags of each command (README.md), each a setting.
DOCUMENTED = {
    "assemble": ["--policy", "--allow-policy", "--max-event-bytes", "--max-chunks",
                 "--max-chunk-chars"],
    "explain": ["--policy", "--allow-policy", "--bootstrap-servers", "--audit-topic",
                "--policies-topic", "--max-event-bytes"],
    "produce": ["--bootstrap-servers", "--topic"],
    "tail": ["--bootstrap-servers"],
    "replay": ["--allow-policy", "--bootstrap-servers", "--input-topic", "--prompts-topic",
               "--audit-topic", "--policies-topic", "--max-event-bytes"],
    "serve": ["--host", "--port", "--policy", "--allow-policy", "--max-pending",
              "--body-timeout", "--idle-timeout", "--log-level", "--max-event-bytes"],
    "policy": ["--policy", "--bootstrap-servers", "--policies-topic"],
    "redrive": ["--bootstrap-servers", "--dlq-topic", "--input-topic"],
    "acls": ["--bootstrap-servers"],
    "topics": ["--bootstrap-servers"],
    "topics create": ["--bootstrap-servers"],
}
READS_EVENTS = ["assemble", "explain", "sweep", "worker", "replay", "serve"]


# A value other than the default for each setting a flag sets; numbers and names otherwise.
SAMPLES = {"max_message_bytes": "20000", "session_timeout_seconds": "30",
           "processing_guarantee": "exactly_once", "compression_type": "gzip",
           "log_level": "DEBUG", "allowed_policies": "estimated", "commit_interval_ms": "250",
           "max_batch_bytes": "8388608"}


def sample(name: str) -> str:
    if name in SAMPLES:
        return SAMPLES[name]
    return "7" if Settings.model_fields[name].annotation in (int, float) else f"x-{name}"


def parsed(command: str, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args([*ARGV[command], *flags])


def options(command: str) -> dict[str, str]:
    """Each option of `command`'s parser -> its dest."""
    parser = build_parser()
    for word in ARGV[command]:
        if word.startswith("-"):
            break
        actions = {a.dest: a for a in parser._actions}
        sub = next((a for a in actions.values() if isinstance(a, argparse._SubParsersAction)),
                   None)
        if sub is None:
            break
        parser = sub.choices[word]
    return {option: action.dest for action in parser._actions for option in action.option_strings}


def test_settings_come_from_assembler_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("ASSEMBLER_PROCESSING_GUARANTEE", "exactly_once")
    monkeypatch.setenv("ASSEMBLER_MAX_CHUNKS", "50")
    settings = load_settings()
    assert settings.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.processing_guarantee == "exactly_once"
    assert settings.limits.max_chunks == 50
    # One transactional id per input partition, the same on every replica: a partition's
    # next owner fences its previous one.
    assert settings.transactional_id_for("retrieval.results", 0) == (
        "context-assembler-retrieval.results-0")


def test_invalid_settings_name_the_variable_and_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_PROCESSING_GUARANTEE", "maybe_once")
    monkeypatch.setenv("ASSEMBLER_HTTP_PORT", "99999")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "ASSEMBLER_PROCESSING_GUARANTEE (--processing-guarantee): " in str(caught.value)
    assert "ASSEMBLER_HTTP_PORT (--http-port): " in str(caught.value)


def test_a_bad_flag_is_a_usage_error_naming_the_flag_and_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err == (
        "context-assembler: invalid settings: ASSEMBLER_SERVE_PORT (--port): Input should be "
        "less than or equal to 65535\n")
    assert main(["produce", "--topic", ""]) == 2  # renamed on produce: named as produce has it
    assert "ASSEMBLER_INPUT_TOPIC (--topic): " in capsys.readouterr().err


def test_a_bad_variable_stops_a_file_command_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ASSEMBLER_MAX_CHUNKS", "many")
    assert main(["assemble", "--out", "-"]) == 2
    assert capsys.readouterr().err.startswith(
        "context-assembler: invalid settings: ASSEMBLER_MAX_CHUNKS (--max-chunks): ")
    events = str(EXAMPLES / "events.jsonl")
    assert main(["assemble", events, "--out", os.devnull, "--max-chunks", "2000"]) == 0


def test_topics_must_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_DLQ_TOPIC", "retrieval.results")
    with pytest.raises(SettingsError, match="must differ"):
        load_settings()


def _bounds(metadata: list[object]) -> list[object]:
    """A field's bounds (ge, le...): pydantic versions differ in what else they keep there."""
    return [item for item in metadata if isinstance(item, annotated_types.BaseMetadata)]


def test_the_commit_interval_defaults_by_guarantee_and_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().commit_interval_seconds == 0.03  # at_least_once
    assert Settings(processing_guarantee="exactly_once").commit_interval_seconds == 0.05
    monkeypatch.setenv("ASSEMBLER_COMMIT_INTERVAL_MS", "")  # empty: unset
    assert load_settings().commit_interval_ms is None
    monkeypatch.setenv("ASSEMBLER_COMMIT_INTERVAL_MS", "0")  # given: whatever the guarantee
    assert load_settings({"processing_guarantee": "exactly_once"}).commit_interval_seconds == 0
    monkeypatch.setenv("ASSEMBLER_COMMIT_INTERVAL_MS", "250")
    assert load_settings().commit_interval_seconds == 0.25
    for bad, why in (("-1", "greater than or equal to 0"), ("5001", "less than or equal to 5000"),
                     ("0.5", "a valid integer")):
        monkeypatch.setenv("ASSEMBLER_COMMIT_INTERVAL_MS", bad)
        with pytest.raises(SettingsError) as caught:
            load_settings()
        assert str(caught.value).startswith(
            "invalid settings: ASSEMBLER_COMMIT_INTERVAL_MS (--commit-interval-ms): ")
        assert why in str(caught.value)


def test_the_event_limits_are_declared_once_in_limits_and_read_from_flat_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, limit in Limits.model_fields.items():
        field = Settings.model_fields[name]  # ASSEMBLER_MAX_EVENT_BYTES etc.
        assert (field.default, _bounds(field.metadata)) == (limit.default, _bounds(limit.metadata))
    assert Settings().limits == Limits()
    monkeypatch.setenv("ASSEMBLER_MAX_EVENT_BYTES", "1000")
    monkeypatch.setenv("ASSEMBLER_MAX_QUESTION_CHARS", "0")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        "invalid settings: ASSEMBLER_MAX_QUESTION_CHARS (--max-question-chars): Input should be "
        "greater than or equal to 1")
    monkeypatch.setenv("ASSEMBLER_MAX_QUESTION_CHARS", "80")
    assert load_settings().limits == Limits(max_event_bytes=1000, max_question_chars=80)


def test_settings_errors_are_the_projects_errors() -> None:
    assert issubclass(SettingsError, ContextAssemblerError)


def test_every_command_parser_is_described_here() -> None:
    assert set(ARGV) == set(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_flag_of_a_setting_is_read_through_the_one_model(
    command: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every option whose dest is a setting was made from the model, for the settings the
    command reads; each such flag, given, sets its setting as its variable would."""
    flags = {name: command_flag(name, command) for name in COMMANDS[command]}
    made = {flag.option: name for name, flag in flags.items() if flag is not None}
    settings_options = {option: dest for option, dest in options(command).items()
                        if dest in Settings.model_fields}
    assert settings_options == made
    for option, name in made.items():
        value = sample(name)
        given = read_settings(parsed(command, option, value))
        assert getattr(given, name) != Settings.model_fields[name].get_default(), option
        monkeypatch.setenv(variable_of(name), value)
        assert getattr(given, name) == getattr(load_settings(), name), option
        monkeypatch.delenv(variable_of(name))


def test_the_documented_flags_are_settings() -> None:
    for command, documented in DOCUMENTED.items():
        dests = options(command)
        assert [o for o in documented if dests.get(o) not in Settings.model_fields] == [], command


@pytest.mark.parametrize("command", READS_EVENTS)
def test_every_limit_has_a_flag_on_every_command_that_reads_events(command: str) -> None:
    dests = options(command)
    for name in Limits.model_fields:
        assert dests[f"--{name.replace('_', '-')}"] == name


def test_a_flag_wins_over_the_variable_which_wins_over_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert read_settings(parsed("assemble")).max_chunk_id_chars == 256
    monkeypatch.setenv("ASSEMBLER_MAX_CHUNK_ID_CHARS", "40")
    monkeypatch.setenv("ASSEMBLER_ALLOWED_POLICIES", "window-8k,estimated")
    assert read_settings(parsed("assemble")).max_chunk_id_chars == 40
    from_flag = read_settings(parsed("assemble", "--max-chunk-id-chars", "12",
                                     "--allow-policy", "rank-fidelity"))
    assert from_flag.max_chunk_id_chars == 12
    assert from_flag.allowed_policies == ("rank-fidelity",)
    assert read_settings(parsed("assemble")).allowed_policies == ("window-8k", "estimated")
    monkeypatch.setenv("ASSEMBLER_BOOTSTRAP_SERVERS", "env:9092")
    assert read_settings(parsed("tail")).bootstrap_servers == "env:9092"
    assert read_settings(parsed("tail", "--bootstrap-servers", "flag:9092")).bootstrap_servers == (
        "flag:9092")


def test_the_file_commands_read_the_environment_too(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ASSEMBLER_POLICY_FILE", "estimated")
    assert main(["policy"]) == 0
    assert capsys.readouterr().out.startswith("# estimated sha256:")
    assert main(["policy", "--policy", "rank-fidelity"]) == 0
    assert capsys.readouterr().out.startswith("# rank-fidelity sha256:")


def test_secrets_and_security_settings_have_no_flag() -> None:
    for name in Settings.model_fields:
        if name.startswith(("sasl_", "ssl_", "security_")):
            assert flag_of(name) is None, name


def test_every_setting_is_described_and_read_by_some_command() -> None:
    read = {name for names in COMMANDS.values() for name in names}
    for name, field in Settings.model_fields.items():
        assert field.description, name
        assert name in read, name
    assert read <= set(Settings.model_fields)


def test_the_settings_reference_is_generated_from_the_model() -> None:
    """docs/settings.md is what `make docs-settings` writes."""
    committed = (REPO / "docs" / "settings.md").read_text("utf-8")
    assert committed == reference(), "run: make docs-settings"
    for name in Settings.model_fields:
        assert f"`ASSEMBLER_{name.upper()}`" in committed


def test_the_engine_caches_take_the_byte_caps_the_settings_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    from context_assembler.engine import caches, words

    defaults: dict[str, int] = {}
    for name in ("facts", "words", "tokens"):
        cap = caches.CACHES[name].max_bytes
        assert cap is not None
        defaults[name] = cap
    (tmp_path / "none.jsonl").write_text("")
    try:
        monkeypatch.setenv("ASSEMBLER_CACHE_FACTS_BYTES", "65536")
        assert main(["assemble", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "out"),
                     "--cache-words-bytes", "4096"]) == 0
        assert caches.CACHES["facts"].max_bytes == 65536
        assert caches.CACHES["words"].max_bytes == 4096
        assert words.CACHE.max_bytes == 4096  # a live cache shrinks at once
        assert caches.CACHES["tokens"].max_bytes == defaults["tokens"]
    finally:
        caches.configure(**defaults)


@pytest.mark.parametrize("name", ["a b", "x$(id)", "..", ".", "a" * 250, "*", "", "top\nic",
                                  "tópico", "a/b"])
@pytest.mark.parametrize("variable", ["ASSEMBLER_INPUT_TOPIC", "ASSEMBLER_PROMPTS_TOPIC",
                                      "ASSEMBLER_AUDIT_TOPIC", "ASSEMBLER_DLQ_TOPIC",
                                      "ASSEMBLER_POLICIES_TOPIC"])
def test_a_topic_name_kafka_refuses_or_the_acl_wildcard_stops_the_start(
    variable: str, name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(variable, name)
    with pytest.raises(SettingsError, match=f"{variable} .*Kafka's rule|{variable} .*at least 1"):
        load_settings()


def test_every_topic_name_kafka_takes_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("a" * 249, "a.b_c-D9", "...", "_"):
        monkeypatch.setenv("ASSEMBLER_INPUT_TOPIC", name)
        assert load_settings().input_topic == name


@pytest.mark.parametrize(("variable", "value", "problem"), [
    ("ASSEMBLER_GROUP_ID", "*", "the ACL wildcard"),
    ("ASSEMBLER_GROUP_ID", "  ", "may not be blank"),
    ("ASSEMBLER_GROUP_ID", "g\x1b[2J", "control or line-break"),
    ("ASSEMBLER_TRANSACTIONAL_ID", "", "may not be blank"),
    ("ASSEMBLER_TRANSACTIONAL_ID", " ", "may not be blank"),
    ("ASSEMBLER_TRANSACTIONAL_ID", "*", "the ACL wildcard"),
    ("ASSEMBLER_TRANSACTIONAL_ID", "t\nx", "control or line-break"),
])
def test_a_blank_or_wildcard_group_or_transactional_id_stops_the_start(
    variable: str, value: str, problem: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=f"{variable} .*{problem}"):
        load_settings()


@pytest.mark.parametrize("servers", [":", ":99999", ":-1", "[::1", "a:", "a:0", "a b:9092",
                                     "k1:9092,", "k1:9092,:1", "[nope]:9092", "a:\uff19\uff10\uff19\uff12"])
def test_bootstrap_servers_the_client_cannot_read_exit_2_naming_the_setting(
    servers: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["tail", "prompts", "--bootstrap-servers", servers]) == 2
    assert capsys.readouterr().err.startswith(
        "context-assembler: invalid settings: ASSEMBLER_BOOTSTRAP_SERVERS (--bootstrap-servers): ")


def test_every_broker_address_the_client_reads_is_taken() -> None:
    for servers in ("localhost", "k1:9092,k2:9093", "[::1]:9092", "[::1]", "::1",
                    "10.0.0.1:9092", " k1:1 , k2:65535"):
        assert Settings(bootstrap_servers=servers).bootstrap_servers == servers


@pytest.mark.parametrize("variable", [f"ASSEMBLER_{name.upper()}" for name in Limits.model_fields])
def test_a_limit_beyond_32_bits_exits_2(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    events = tmp_path / "in.jsonl"
    events.write_bytes((EXAMPLES / "events.jsonl").read_bytes())
    monkeypatch.setenv(variable, str(10**30))
    assert main(["assemble", str(events), "--out", os.devnull]) == 2
    assert capsys.readouterr().err.startswith(
        f"context-assembler: invalid settings: {variable} ")
    monkeypatch.setenv(variable, str(2**31 - 1))
    monkeypatch.setenv("ASSEMBLER_MAX_BATCH_BYTES", str(2**31 - 1))  # at least max_event_bytes
    assert main(["assemble", str(events), "--out", os.devnull]) == 0


@pytest.mark.parametrize("cap", [1, 7, 191])
def test_a_token_cache_cap_under_one_entry_still_keeps_one(cap: int) -> None:
    from context_assembler.engine import caches

    default = caches.CACHES["tokens"].max_bytes
    assert default is not None
    try:
        caches.configure(tokens=cap)
        cache = caches.count_cache("tokens")  # as a tokenizer first used after the start
        assert cache.max_entries == 1
    finally:
        caches.configure(tokens=default)


def test_a_tiny_cache_cap_changes_no_output(tmp_path: Path) -> None:
    events = str(EXAMPLES / "events.jsonl")
    outputs = []
    for cap in ("1", None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASSEMBLER_")}
        if cap:
            env.update(ASSEMBLER_CACHE_TOKENS_BYTES=cap, ASSEMBLER_CACHE_WORDS_BYTES=cap,
                       ASSEMBLER_CACHE_FACTS_BYTES=cap)
        done = subprocess.run([sys.executable, "-m", "context_assembler.cli", "assemble", events],
                              env=env, capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and outputs[0]


def test_replay_from_before_1970_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--from-time", "1969-12-31T23:59:59Z"]) == 2
    assert "before 1970-01-01T00:00:00Z" in capsys.readouterr().err


def test_a_misspelled_variable_is_named_with_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    monkeypatch.setenv("ASSEMBLER_SASL_PASWORD", "s3cret-value")
    monkeypatch.setenv("ASSEMBLER_MAX_EVENTS_BYTES", "1")
    monkeypatch.setenv("assembler_allowed_policys", "window-8k")
    monkeypatch.setenv("ASSEMBLER_ZZZ", "1")
    monkeypatch.setenv("ASSEMBLER_MAX_CHUNKS", "50")  # known: no warning
    events = str(EXAMPLES / "events.jsonl")
    assert main(["assemble", events, "--out", os.devnull]) == 0  # a warning, not an error
    err = capsys.readouterr().err
    assert err.splitlines()[:4] == [
        "context-assembler: warning: ASSEMBLER_MAX_EVENTS_BYTES is not a setting and is "
        "ignored; did you mean ASSEMBLER_MAX_EVENT_BYTES?",
        "context-assembler: warning: ASSEMBLER_SASL_PASWORD is not a setting and is ignored; "
        "did you mean ASSEMBLER_SASL_PASSWORD?",
        "context-assembler: warning: ASSEMBLER_ZZZ is not a setting and is ignored; "
        "docs/settings.md lists the settings",
        "context-assembler: warning: assembler_allowed_policys is not a setting and is "
        "ignored; did you mean ASSEMBLER_ALLOWED_POLICIES?",
    ]
    assert "s3cret-value" not in err and "MAX_CHUNKS" not in err


def test_the_worker_logs_a_misspelled_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    monkeypatch.setenv("ASSEMBLER_PROCESING_GUARANTEE", "exactly_once")
    assert main(["worker", "--policy", str(tmp_path / "missing.toml")]) == 2  # stops at once
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert lines[0]["level"] == "WARNING" and lines[0]["message"] == (
        "ASSEMBLER_PROCESING_GUARANTEE is not a setting and is ignored; did you mean "
        "ASSEMBLER_PROCESSING_GUARANTEE?")
