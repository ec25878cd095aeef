"""The worker against a real schema registry (Apicurio Registry's Confluent-compatible API) and
a real broker, under both guarantees: confluent-kafka's JSONSerializer frames the input,
its JSONDeserializer reads the outputs; the JSON the worker frames is byte for byte the
plain path's; unknown ids and mismatches are dead letters; a registry that goes down
holds the input until it is back, with nothing lost."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from context_assembler.contract.catalogue import canonical
from context_assembler.generate.schemas import json_schemas
from context_assembler.intake.framing import frame, split
from context_assembler.kafka.records import ERR, header
from harness.codecs import librdkafka_produce, librdkafka_read
from harness.kafka import Broker
from harness.registry import Registry
from harness.worker import (
    ALLOWED_POLICIES,
    StartWorker,
    Topics,
    end_offsets,
    events,
    file_mode,
    keyed,
    produce,
    read_topic,
    wait_for,
)
from tests.support.doc_blocks import fresh_shell_env, one_at_a_time, problems, run_block
from tests.support.docs import section_blocks

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]
CONTRACT = canonical(json_schemas()["retrieval-result"])
UNKNOWN_ID = 987654


def topic_env(broker: Broker, topics: Topics, registry: Registry) -> dict[str, str]:
    return {"ASSEMBLER_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
            "ASSEMBLER_INPUT_TOPIC": topics.input, "ASSEMBLER_PROMPTS_TOPIC": topics.prompts,
            "ASSEMBLER_AUDIT_TOPIC": topics.audit, "ASSEMBLER_DLQ_TOPIC": topics.dlq,
            "ASSEMBLER_POLICIES_TOPIC": topics.policies,
            "ASSEMBLER_SCHEMA_REGISTRY_URL": registry.url}


def register(broker: Broker, topics: Topics, registry: Registry) -> dict[str, int]:
    """`context-assembler schemas register` for the topics: subject -> id."""
    done = subprocess.run([sys.executable, "-m", "context_assembler.cli", "schemas", "register"],
                          env={**os.environ, **topic_env(broker, topics, registry)},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    ids = {}
    for line in done.stdout.splitlines():
        subject, rest = line.split(": ", 1)
        ids[subject] = int(rest.rsplit(" ", 1)[1])
    return ids


async def registered(broker: Broker, registry: Registry) -> tuple[Topics, dict[str, int]]:
    """Topics of their own, created, with their schemas registered (subject -> id)."""
    topics = Topics.fresh()
    await topics.create(broker)
    return topics, await asyncio.to_thread(register, broker, topics, registry)


def command(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`context-assembler ARGS` with `env`, and no other ASSEMBLER_ setting."""
    clean = {name: value for name, value in os.environ.items()
             if not name.startswith("ASSEMBLER_")}
    return subprocess.run([sys.executable, "-m", "context_assembler.cli", *args],
                          env={**clean, **(env or {})}, capture_output=True, text=True,
                          timeout=120, check=False)


def registry_client(registry: Registry) -> SchemaRegistryClient:
    """confluent-kafka's client with a request timeout: its default waits for ever, so a
    registry that accepts a connection and never answers would hold the test until pytest's
    timeout; a timed-out request is retried on a new connection."""
    return SchemaRegistryClient({"url": registry.url, "timeout": 30})


def serialized(registry: Registry, topic: str, lines: list[bytes]) -> list[bytes]:
    """The events as confluent-kafka's JSONSerializer frames them: the id of the contract's
    schema under <topic>-value (the topic strategy, as `schemas register` names subjects),
    looked up, not registered."""
    serializer = JSONSerializer(CONTRACT, registry_client(registry),
                                conf={"auto.register.schemas": False,
                                      "subject.name.strategy.type": "TOPIC"})
    context = SerializationContext(topic, MessageField.VALUE)
    return [serializer(json.loads(line), context) for line in lines]


def deserialized(registry: Registry, topic: str, value: bytes) -> object:
    return JSONDeserializer(None, schema_registry_client=registry_client(registry))(
        value, SerializationContext(topic, MessageField.VALUE))


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_framed_input_is_answered_framed_with_the_plain_paths_bytes(
    broker: Broker, schema_registry: Registry, logs: Path, guarantee: str,
    running_worker: StartWorker,
) -> None:
    topics, ids = await registered(broker, schema_registry)
    lines = events(40)
    expected_prompts, expected_audits = file_mode(lines)
    framed_lines, plain_lines = lines[:30], lines[30:]
    framed = await asyncio.to_thread(serialized, schema_registry, topics.input, framed_lines)
    assert {split(value)[0] for value in framed} == {ids[f"{topics.input}-value"]}
    unknown = frame(UNKNOWN_ID, lines[0])
    mismatch = frame(ids[f"{topics.input}-value"], b'{"request_id": "no-question", "chunks": []}')
    worker = running_worker(topics, guarantee, ready=False,
                            env={"ASSEMBLER_SCHEMA_REGISTRY_URL": schema_registry.url})
    try:
        await asyncio.to_thread(worker.wait_ready)
        records = [(json.loads(line)["request_id"].encode(), value)
                   for line, value in zip(framed_lines, framed, strict=True)]
        records += [(b"unknown", unknown), (b"no-question", mismatch)]
        records += [(key, value) for key, value, _ in keyed(plain_lines)]  # the same topic
        await asyncio.to_thread(librdkafka_produce, broker, topics.input, "zstd", records)
        prompts = await asyncio.to_thread(librdkafka_read, broker, topics.prompts, len(lines))
        audits = await asyncio.to_thread(librdkafka_read, broker, topics.audit, len(lines))
        letters = await read_topic(broker, topics.dlq, until=2, settle=1.0)
        assert worker.alive()
    finally:
        assert worker.stop() == 0
    for outputs, expected, subject in ((prompts, expected_prompts, topics.prompts),
                                       (audits, expected_audits, topics.audit)):
        assert len(outputs) == len(lines)  # every event answered, once
        for key, value in outputs:
            schema_id, payload = split(value)
            assert schema_id == ids[f"{subject}-value"]
            assert payload == expected[key.decode()]  # the plain path's bytes
        key, value = outputs[0]
        assert deserialized(schema_registry, subject, value) == orjson.loads(
            expected[key.decode()])
    reasons = {letter.key: header(letter.headers, f"{ERR}exception.message")
               for letter in letters}
    assert reasons == {
        b"unknown": f"schema id {UNKNOWN_ID}: not found in the schema registry".encode(),
        b"no-question": reasons[b"no-question"],
    }
    assert reasons[b"no-question"] is not None and reasons[b"no-question"].startswith(
        f"does not match schema id {ids[f'{topics.input}-value']}: <root>: \"question\" is a "
        "required property".encode())
    assert {letter.key: letter.value for letter in letters} == {b"unknown": unknown,
                                                               b"no-question": mismatch}
    policies = await read_topic(broker, topics.policies, until=2)  # service's and allowed
    assert {split(p.value)[0] for p in policies} == {ids[f"{topics.policies}-value"]}
    # The reading commands read framed records: replay under the recorded policies (the
    # input, checked against the registry as the worker checks it, the outputs and the
    # policies topic), and tail.
    kafka = [f"--bootstrap-servers={broker.bootstrap_servers}"]
    replay = await asyncio.to_thread(
        command, "replay", *kafka, "--input-topic", topics.input, "--prompts-topic",
        topics.prompts, "--audit-topic", topics.audit, "--policies-topic", topics.policies,
        "--policy", "recorded", "--compare",
        *[f"--allow-policy={name}" for name in ALLOWED_POLICIES],
        env={"ASSEMBLER_SCHEMA_REGISTRY_URL": schema_registry.url})
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert replay.stdout.endswith("42 identical, 0 different, 0 not published\n"), replay.stdout
    tail = await asyncio.to_thread(command, "tail", "prompts", "-n", "40", *kafka,
                                   "--prompts-topic", topics.prompts)
    assert tail.returncode == 0, tail.stderr
    shown = tail.stdout.splitlines()
    assert len(shown) == 40 and not [line for line in shown if "not a prompts record" in line]
    request_id = json.loads(framed_lines[0])["request_id"]
    explain = await asyncio.to_thread(command, "explain", request_id, "--kafka", *kafka,
                                      "--audit-topic", topics.audit, "--policies-topic",
                                      topics.policies,
                                      *[f"--allow-policy={name}" for name in ALLOWED_POLICIES])
    assert explain.returncode == 0, explain.stderr
    assert f"request {request_id} |" in explain.stdout and f"input {topics.input}/" in explain.stdout


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_registry_down_pauses_reading_and_reading_resumes_once_it_is_back(
    broker: Broker, schema_registry: Registry, logs: Path, guarantee: str,
    running_worker: StartWorker,
) -> None:
    topics, ids = await registered(broker, schema_registry)
    # A second id, which the worker has not seen when the registry goes down.
    client = registry_client(schema_registry)
    other = json.loads(CONTRACT) | {"description": "a second version, for this test"}
    other_id = client.register_schema(f"{topics.input}-other", Schema(json.dumps(other), "JSON"))
    lines = events(30)
    expected_prompts, _ = file_mode(lines)
    first = [frame(ids[f"{topics.input}-value"], line) for line in lines[:10]]
    held = [frame(other_id, line) for line in lines[10:]]
    worker = running_worker(topics, guarantee, ready=False,
                            env={"ASSEMBLER_SCHEMA_REGISTRY_URL": schema_registry.url})
    try:
        await asyncio.to_thread(worker.wait_ready)
        await produce(broker, topics.input, [(None, value, []) for value in first])
        await read_topic(broker, topics.prompts, until=10)
        await asyncio.to_thread(schema_registry.stop)
        try:
            await produce(broker, topics.input, [(None, value, []) for value in held])
            await wait_for(lambda: worker.get("/ready")[0] == 503, timeout=60)
            _, reason = worker.get("/ready")
            assert b"schema registry" in reason, reason
            answered = await read_topic(broker, topics.prompts, until=10, settle=3.0,
                                        committed_only=True)
            assert len(answered) == 10  # the rest are held
            assert worker.alive()
        finally:
            await asyncio.to_thread(schema_registry.restart)
        prompts = await read_topic(broker, topics.prompts, until=len(lines), settle=1.0,
                                   committed_only=True)
        await wait_for(lambda: worker.get("/ready")[0] == 200, timeout=60)
    finally:
        assert worker.stop() == 0
    assert {split(p.value)[1] for p in prompts} == set(expected_prompts.values())  # none lost
    assert sum((await end_offsets(broker, topics.dlq)).values()) == 0


async def test_a_worker_whose_output_schemas_are_not_registered_stops_at_start(
    broker: Broker, schema_registry: Registry, logs: Path, running_worker: StartWorker,
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    worker = running_worker(topics, ready=False,
                            env={"ASSEMBLER_SCHEMA_REGISTRY_URL": schema_registry.url})
    assert worker.process is not None
    assert await asyncio.to_thread(worker.process.wait, 120) == 2
    assert (f"cannot start: subject {topics.prompts}-value does not hold this version's "
            "assembled-prompt schema: register it with `context-assembler schemas register`"
            in worker.log_tail())


def test_register_registers_nothing_when_a_subjects_rule_refuses_a_schema(
    schema_registry: Registry,
) -> None:
    tag = os.urandom(4).hex()
    env = {"ASSEMBLER_SCHEMA_REGISTRY_URL": schema_registry.url,
           "ASSEMBLER_INPUT_TOPIC": f"{tag}.in", "ASSEMBLER_PROMPTS_TOPIC": f"{tag}.prompts",
           "ASSEMBLER_AUDIT_TOPIC": f"{tag}.audit", "ASSEMBLER_DLQ_TOPIC": f"{tag}.dlq",
           "ASSEMBLER_POLICIES_TOPIC": f"{tag}.policies"}
    client = registry_client(schema_registry)
    earlier = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "RetrievalResult",
               "type": "object", "properties": {"request_id": {"type": "integer"}},
               "required": ["request_id"], "additionalProperties": False}
    client.register_schema(f"{tag}.prompts-value", Schema(json.dumps(earlier), "JSON"))
    client.set_compatibility(f"{tag}.prompts-value", "BACKWARD")
    refused = command("schemas", "register", env=env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr == ("context-assembler: incompatible with the versions the registry "
                              f"holds under {tag}.prompts-value: nothing was registered\n")
    assert sorted(s for s in client.get_subjects() if s.startswith(tag)) == [
        f"{tag}.prompts-value"]
    assert client.get_versions(f"{tag}.prompts-value") == [1]
    client.set_compatibility(f"{tag}.prompts-value", "NONE")  # the operator allows the change
    accepted = command("schemas", "register", env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert len(accepted.stdout.splitlines()) == 4
    assert client.get_versions(f"{tag}.prompts-value") == [1, 2]


def test_the_pages_try_it_block_runs_as_written() -> None:
    """docs/schema-registry.md, "## Try it": a registry of its own, started and stopped."""
    (block,) = [b for b in section_blocks("docs/schema-registry.md", "## Try it") if b.is_shell]
    with one_at_a_time():
        done = run_block(block, fresh_shell_env())
    assert not problems(done), problems(done)
    assert done.output.splitlines()[-4:] == [
        "retrieval.results-value: retrieval-result schema id 1",
        "prompts.assembled-value: assembled-prompt schema id 2",
        "context.audit-value: assembly-audit schema id 3",
        "assembler.policies-value: policy-record schema id 4",
    ]
