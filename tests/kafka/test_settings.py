import pytest

from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.intake.codec import Limits
from context_assembler.kafka.settings import Settings, SettingsError, load_settings


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


def test_invalid_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_PROCESSING_GUARANTEE", "maybe_once")
    monkeypatch.setenv("ASSEMBLER_HTTP_PORT", "99999")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "ASSEMBLER_PROCESSING_GUARANTEE" in str(caught.value)
    assert "ASSEMBLER_HTTP_PORT" in str(caught.value)


def test_topics_must_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_DLQ_TOPIC", "retrieval.results")
    with pytest.raises(SettingsError, match="must differ"):
        load_settings()


def test_the_event_limits_are_declared_once_in_limits_and_read_from_flat_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, limit in Limits.model_fields.items():
        field = Settings.model_fields[name]  # ASSEMBLER_MAX_EVENT_BYTES etc.
        assert (field.default, field.metadata) == (limit.default, limit.metadata)
    assert Settings().limits == Limits()
    monkeypatch.setenv("ASSEMBLER_MAX_EVENT_BYTES", "1000")
    monkeypatch.setenv("ASSEMBLER_MAX_QUESTION_CHARS", "0")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        "invalid settings: ASSEMBLER_MAX_QUESTION_CHARS: Input should be greater than or equal to 1")
    monkeypatch.setenv("ASSEMBLER_MAX_QUESTION_CHARS", "80")
    assert load_settings().limits == Limits(max_event_bytes=1000, max_question_chars=80)


def test_settings_errors_are_the_projects_errors() -> None:
    assert issubclass(SettingsError, ContextAssemblerError)
