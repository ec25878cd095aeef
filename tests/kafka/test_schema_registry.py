"""Framed events and outputs against confluent-kafka's mock registry (`mock://`): the same
bytes as the plain path's, dead letters for unknown ids and mismatches, bounded schemas, and
a registry that does not answer holding the events until it does."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import orjson
import pytest
from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, Schema, SchemaReference
from confluent_kafka.schema_registry.error import SchemaRegistryError
from hypothesis import given
from hypothesis import settings as settings_hypothesis
from hypothesis import strategies as st

from context_assembler.contract.catalogue import canonical
from context_assembler.contract.models import RejectReason
from context_assembler.engine.policy import Policy
from context_assembler.generate.schemas import json_schemas
from context_assembler.intake.framing import RegisteredSchema, UnknownSchema, frame
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka import schema_registry as registry_module
from context_assembler.kafka.records import ERR, handle, header
from context_assembler.kafka.runtime.retries import Stopped
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.schema_registry import (
    NotRegistered,
    RegistryUnavailable,
    SchemaRegistry,
    contract_schemas,
    subject_of,
)
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings, SettingsError, load_settings
from tests.factories import EXAMPLES
from tests.kafka.test_records import CONTEXT, GOOD, origin

URL = "http://registry.example:8081"
CONTRACT = canonical(json_schemas()["retrieval-result"])


def settings(**values: object) -> Settings:
    return Settings.model_validate({"schema_registry_url": URL, "prompts_topic": "prompts",
                                    "audit_topic": "audit", "dlq_topic": "dlq",
                                    "retry_backoff_max_seconds": 0.05, **values})


def mock() -> AsyncSchemaRegistryClient:
    return AsyncSchemaRegistryClient.new_client({"url": "mock://registry"})


async def registered(client: AsyncSchemaRegistryClient, text: str = CONTRACT,
                     kind: str = "JSON", subject: str = "retrieval.results-value") -> int:
    return await client.register_schema(subject, Schema(text, kind))


def stricter_contract() -> str:
    schema = json_schemas()["retrieval-result"]
    return json.dumps({**schema, "properties": {**schema["properties"],
                                                "question": {"type": "string",
                                                             "maxLength": 3}}})


async def test_a_framed_event_gives_the_bytes_of_its_plain_twin_and_framed_outputs() -> None:
    client = mock()
    schema_id = await registered(client)
    schemas = await SchemaRegistry(settings(), client=client).resolve([schema_id])
    plain = handle(GOOD, origin(), CONTEXT)
    framed = handle(frame(schema_id, GOOD), origin(),
                    replace(CONTEXT, schemas=schemas, prompt_schema_id=11, audit_schema_id=12))
    assert framed.rejected is None and plain.rejected is None
    assert [r.value for r in framed.records] == [frame(11, plain.records[0].value),
                                                 frame(12, plain.records[1].value)]
    assert [r.headers for r in framed.records] == [r.headers for r in plain.records]
    # and without output ids, the outputs of a framed event are its plain twin's
    unframed_out = handle(frame(schema_id, GOOD), origin(), replace(CONTEXT, schemas=schemas))
    assert unframed_out.records == plain.records


async def test_an_id_the_registry_does_not_know_is_a_dead_letter_with_its_reason() -> None:
    schemas = await SchemaRegistry(settings(), client=mock()).resolve([999])
    raw = frame(999, GOOD)
    outcome = handle(raw, origin(), replace(CONTEXT, schemas=schemas))
    assert outcome.rejected is not None and outcome.rejected.reason == RejectReason.SCHEMA
    (letter,) = outcome.records
    assert letter.topic == "dlq" and letter.value == raw
    assert header(letter.headers, f"{ERR}exception.message") == (
        b"schema id 999: not found in the schema registry")


async def test_an_event_its_schema_refuses_is_a_dead_letter_though_the_contract_takes_it() -> None:
    client = mock()
    schema_id = await registered(client, stricter_contract())
    schemas = await SchemaRegistry(settings(), client=client).resolve([schema_id])
    outcome = handle(frame(schema_id, GOOD), origin(), replace(CONTEXT, schemas=schemas))
    assert outcome.rejected is not None and outcome.rejected.reason == RejectReason.SCHEMA
    assert outcome.rejected.message.startswith(f"does not match schema id {schema_id}: question")
    assert outcome.rejected.request_id == orjson.loads(GOOD)["request_id"]


def test_a_framed_event_without_a_registry_is_a_dead_letter_saying_so() -> None:
    outcome = handle(frame(1, GOOD), origin(), CONTEXT)
    assert outcome.rejected is not None and outcome.rejected.reason == RejectReason.SCHEMA
    assert "no schema registry is set (ASSEMBLER_SCHEMA_REGISTRY_URL)" in outcome.rejected.message


async def test_only_a_bounded_json_schema_of_its_own_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = mock()
    avro = await registered(client, '{"type": "string"}', "AVRO", "other-value")
    referring = await client.register_schema("ref-value", Schema(
        CONTRACT, "JSON", [SchemaReference("other.json", "other-value", 1)]))
    broken = await registered(client, '{"type": 12}', subject="broken-value")
    big = json.dumps({"description": "x" * 2000})
    large = await registered(client, big, subject="big-value")
    monkeypatch.setattr(registry_module, "MAX_SCHEMA_BYTES", 1000)
    resolved = await SchemaRegistry(settings(), client=client).resolve(
        [avro, referring, broken, large])
    reasons = {i: r.reason for i, r in resolved.items() if isinstance(r, UnknownSchema)}
    assert reasons == {
        avro: "a schema of type AVRO, not JSON",
        referring: "refers to other schemas, which are not followed",
        broken: reasons[broken],
        large: f"{len(big)} bytes, over the 1000 a schema may have here",
    }
    assert reasons[broken].startswith("not a valid JSON Schema: 12 is not valid")


async def test_the_schemas_held_are_bounded_in_bytes_and_the_clients_own_index_emptied() -> None:
    client = mock()
    ids = [await registered(client, json.dumps({"title": f"S{i}", "type": "object"}),
                            subject=f"s{i}-value") for i in range(20)]
    registry = SchemaRegistry(settings(), cache_bytes=5 * registry_module.ENTRY_BYTES + 2000,
                              client=client)
    for schema_id in ids:
        assert isinstance((await registry.resolve([schema_id]))[schema_id], RegisteredSchema)
        assert registry.cache.nbytes <= registry.cache.max_bytes
    assert 0 < len(registry.cache) < 6
    assert not client._cache.schema_id_index  # the client's index is unbounded: emptied


async def test_an_unknown_id_is_asked_for_once_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    client = mock()
    asked: list[int] = []
    real = client.get_schema

    async def counting(schema_id: int, *args: Any, **kwargs: Any) -> Schema:
        asked.append(schema_id)
        return await real(schema_id, *args, **kwargs)

    monkeypatch.setattr(client, "get_schema", counting)
    registry = SchemaRegistry(settings(), client=client)
    for _ in range(3):
        await registry.resolve([404404])
    assert asked == [404404]
    monkeypatch.setattr(registry_module, "UNKNOWN_FOR_SECONDS", -1.0)
    await registry.resolve([404405])
    await registry.resolve([404405])
    assert asked == [404404, 404405, 404405]  # expired at once: asked again


class Flaky(SchemaRegistry):
    """Does not answer `failures` times, then answers from the mock registry."""

    def __init__(self, failures: int) -> None:
        super().__init__(settings(), client=mock())
        self.failures = failures

    async def resolve(self, ids: Any) -> Any:
        if self.failures:
            self.failures -= 1
            raise RegistryUnavailable("schema id 1: ConnectError: connection refused")
        return await super().resolve(ids)


def runner_with(schemas: SchemaRegistry, **values: object) -> EventRunner:
    return EventRunner(settings(**values), PolicyRegistry(Policy()), Metrics(), schemas=schemas)


async def test_a_registry_that_does_not_answer_holds_the_events_until_it_does() -> None:
    flaky = Flaky(failures=4)
    schema_id = await registered(flaky.client)
    runner = runner_with(flaky)
    blocked: list[str | None] = []

    async def watch() -> None:
        while True:
            blocked.append(runner.blocked)
            await asyncio.sleep(0.01)

    watching = asyncio.create_task(watch())
    outcomes = await runner.process_all([(frame(schema_id, GOOD), origin()), (GOOD, origin())])
    watching.cancel()
    assert flaky.failures == 0
    assert any(reason and "schema registry" in reason and "connection refused" in reason
               for reason in blocked)
    assert runner.blocked is None
    assert [o.rejected for o in outcomes] == [None, None]
    assert outcomes[0].records == outcomes[1].records
    runner.close()


async def test_plain_events_need_no_registry() -> None:
    runner = runner_with(Flaky(failures=10**6))
    (outcome,) = await runner.process_all([(GOOD, origin())])
    assert outcome.rejected is None
    runner.close()


async def test_stopping_while_the_registry_does_not_answer_leaves_the_events_unhandled(
    exits: list[float],
) -> None:
    runner = runner_with(Flaky(failures=10**6), shutdown_grace_seconds=5)
    task = asyncio.create_task(runner.process_all([(frame(1, GOOD), origin())]))
    await asyncio.sleep(0.1)
    runner.stop()
    with pytest.raises(Stopped):
        await asyncio.wait_for(task, 1)
    runner.close()


async def test_output_ids_are_looked_up_or_registered() -> None:
    client = mock()
    registry = SchemaRegistry(settings(), client=client)
    with pytest.raises(NotRegistered, match="schemas register"):
        await registry.output_ids(register=False)
    registered_ids = await registry.output_ids(register=True)
    assert await registry.output_ids(register=False) == registered_ids
    assert len({registered_ids.prompt, registered_ids.audit, registered_ids.policy}) == 3


@pytest.mark.parametrize(("strategy", "subjects"), [
    ("topic", ["retrieval.results-value", "prompts-value", "audit-value",
               "assembler.policies-value"]),
    ("record", ["RetrievalResult", "AssembledPrompt", "AssemblyAudit", "PolicyRecord"]),
    ("topic_record", ["retrieval.results-RetrievalResult", "prompts-AssembledPrompt",
                      "audit-AssemblyAudit", "assembler.policies-PolicyRecord"]),
])
def test_subjects_follow_the_naming_strategy(strategy: str, subjects: list[str]) -> None:
    named = contract_schemas(settings(schema_registry_subject_strategy=strategy))
    assert [c.subject for c in named] == subjects
    assert subject_of(strategy, "t", "T") in {"t-value", "T", "t-T"}


def test_the_registered_text_is_the_schema_file() -> None:
    (retrieval, *_) = contract_schemas(settings())
    assert retrieval.text == CONTRACT


def test_the_password_is_read_from_its_file(tmp_path: Any) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t:with:colons\n")
    config = registry_module.client_config(settings(
        schema_registry_user="KEY", schema_registry_password_file=str(secret),
        schema_registry_ca_file=str(secret)))
    assert config["basic.auth.user.info"] == "KEY:s3cr3t:with:colons"
    assert config["ssl.ca.location"] == str(secret)
    assert config["timeout"] == registry_module.REQUEST_TIMEOUT_SECONDS


@pytest.mark.parametrize(("values", "problem"), [
    ({"schema_registry_ca_file": "pyproject.toml"}, "needs ASSEMBLER_SCHEMA_REGISTRY_URL"),
    ({"schema_registry_auto_register": "true"}, "needs ASSEMBLER_SCHEMA_REGISTRY_URL"),
    ({"schema_registry_url": URL, "schema_registry_user": "KEY"}, "go together"),
    ({"schema_registry_url": "registry:8081"}, "not an http:// or https:// URL"),
])
def test_registry_settings_that_contradict_themselves_are_refused(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], problem: str,
) -> None:
    for name, value in values.items():
        monkeypatch.setenv(f"ASSEMBLER_{name.upper()}", value)
    with pytest.raises(SettingsError, match=problem):
        load_settings()


EXAMPLE_LINES = (EXAMPLES / "events.jsonl").read_bytes().splitlines()
CONTRACT_SCHEMA = RegisteredSchema.compile(1, CONTRACT)


@settings_hypothesis(max_examples=25, deadline=None)
@given(st.sampled_from(EXAMPLE_LINES), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
       st.integers(0, 2**32 - 1))
def test_framed_outputs_are_the_plain_bytes_behind_their_ids(
    line: bytes, input_id: int, prompt_id: int, audit_id: int,
) -> None:
    """Same event, policy and ids: the same bytes, whichever the ids, and the plain path's
    JSON behind them."""
    context = replace(CONTEXT, schemas={input_id: replace(CONTRACT_SCHEMA, schema_id=input_id)},
                      prompt_schema_id=prompt_id, audit_schema_id=audit_id)
    framed = handle(frame(input_id, line), origin(), context)
    again = handle(frame(input_id, line), origin(), context)
    plain = handle(line, origin(), CONTEXT)
    assert framed.records == again.records
    assert [r.value for r in framed.records] == [frame(prompt_id, plain.records[0].value),
                                                 frame(audit_id, plain.records[1].value)]


class Answering404:
    """A URL that names no registry API: a web server's 404, without a registry's code."""

    async def get_schema(self, schema_id: int, *args: Any, **kwargs: Any) -> Schema:
        raise SchemaRegistryError(404, None, "None")  # type: ignore[arg-type]  # as it is raised

    async def clear_caches(self) -> None:
        pass


async def test_a_404_that_is_not_the_registrys_answer_is_retried_not_a_dead_letter() -> None:
    registry = SchemaRegistry(settings(), client=Answering404())  # type: ignore[arg-type]
    with pytest.raises(RegistryUnavailable, match="Confluent-compatible base URL"):
        await registry.resolve([1])
