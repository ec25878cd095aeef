"""The catalogue declares each topic once: the settings, `topics create`, the schema registry
and the AsyncAPI document take theirs from it."""

from __future__ import annotations

from pathlib import Path

from context_assembler.contract.catalogue import RECORDS, TOPICS, canonical
from context_assembler.kafka.schema_registry import contract_schemas
from context_assembler.kafka.tools.topics import worker_topics
from context_assembler.settings import Settings

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_every_topic_setting_is_a_topic_of_the_catalogue_and_defaults_to_its_name() -> None:
    settings = [name for name in Settings.model_fields if name.endswith("_topic")]
    assert settings == [topic.setting for topic in TOPICS]
    for topic in TOPICS:
        assert Settings.model_fields[topic.setting].get_default() == topic.default
        assert topic.usage in (Settings.model_fields[topic.setting].description or "")


def test_topics_create_makes_the_catalogues_topics_under_the_names_the_settings_give() -> None:
    renamed = Settings.model_validate({topic.setting: f"x.{topic.default}" for topic in TOPICS})
    specs = worker_topics(renamed, 3, 1)
    assert [spec.name for spec in specs] == [f"x.{topic.default}" for topic in TOPICS]
    for spec, topic in zip(specs, TOPICS, strict=True):
        assert spec.configs["retention.ms"] == str(topic.retention_ms)
        assert spec.configs.get("cleanup.policy", "delete") == topic.cleanup


def test_the_registry_registers_each_record_topics_schema_as_its_file_holds_it() -> None:
    registered = contract_schemas(Settings())
    carried = [topic for topic in TOPICS if topic.record is not None]
    assert [(s.name, s.topic) for s in registered] == [
        (topic.message, topic.default) for topic in carried]
    for schema in registered:
        assert schema.text == (SCHEMAS / f"{schema.name}.schema.json").read_text("utf-8")


def test_each_record_has_its_schema_file() -> None:
    for record in RECORDS:
        assert (SCHEMAS / f"{record.name}.schema.json").read_text("utf-8") == canonical(
            record.json_schema())
