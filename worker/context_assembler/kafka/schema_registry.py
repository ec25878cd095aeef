"""The schema registry (ASSEMBLER_SCHEMA_REGISTRY_URL): the JSON Schemas framed records name,
and the ids the worker frames its outputs with. Client: confluent-kafka's schema_registry.

The registry is trusted as the operator's (like the broker); a record is not, and a framed
record chooses which id the worker asks the registry for. So what a record can make the
worker fetch and hold is bounded: a schema over MAX_SCHEMA_BYTES, not a JSON Schema, or
referring to others is refused (the record is dead-lettered), every request times out after
REQUEST_TIMEOUT_SECONDS, and the schemas held are in a cache bounded in bytes. The client
keeps every schema it ever fetched by id in an index of its own, unbounded (confluent-kafka
2.16.1): it is emptied after each fetch, so the bounded cache here is the one that holds.
An id the registry does not know is remembered as unknown for UNKNOWN_FOR_SECONDS, so a
flood of records naming it costs one request, and one registered later is seen soon after.

A registry that does not answer (down, timing out, answering 5xx or refusing the
credentials) raises RegistryUnavailable: the worker retries with backoff, holding the
events it read, and reads on once it answers; nothing is dead-lettered for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from confluent_kafka.schema_registry import AsyncSchemaRegistryClient, Schema
from confluent_kafka.schema_registry.error import SchemaRegistryError

from context_assembler.contract.catalogue import TOPICS, canonical
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.lru import SizedCache
from context_assembler.intake.framing import (
    InvalidSchema,
    RegisteredSchema,
    Resolved,
    UnknownSchema,
)
from context_assembler.kafka.clients import _read_secret
from context_assembler.settings import Settings

log = logging.getLogger(__name__)
REQUEST_TIMEOUT_SECONDS: Final = 10.0
MAX_SCHEMA_BYTES: Final = 1024 * 1024
SCHEMA_CACHE_BYTES: Final = 32 * 1024 * 1024
# A compiled validator is charged this many times its schema's text, plus a constant (an
# unknown id's entry is the constant alone): above what one measurably holds (bench/README.md).
VALIDATOR_BYTES_PER_BYTE: Final = 16
ENTRY_BYTES: Final = 1024
UNKNOWN_FOR_SECONDS: Final = 60.0
# A registry's "not found" codes: subject, version, schema (and the client's mock registry's
# own). A 404 without one is not the registry's answer: a URL that names no registry API.
NOT_FOUND_CODES: Final = frozenset({40400, 40401, 40402, 40403})
SCHEMA_TYPE: Final = "JSON"


class RegistryUnavailable(ContextAssemblerError):
    """The registry did not answer usefully: retried, never a dead letter."""


class NotRegistered(ContextAssemblerError):
    """An output's schema is not under its subject, and auto-registration is off."""


class Incompatible(ContextAssemblerError):
    """A contract schema the registry refuses as incompatible with a subject's versions."""


@dataclass(frozen=True, slots=True)
class ContractSchema:
    """One of the contract's JSON Schemas, the topic its records go through, its subject."""

    name: str  # as in schemas/<name>.schema.json
    topic: str
    subject: str
    text: str  # the schemas/<name>.schema.json file's text

    @property
    def schema(self) -> Schema:
        return Schema(self.text, SCHEMA_TYPE)


@dataclass(frozen=True, slots=True)
class OutputIds:
    """The registered ids the worker frames its outputs with."""

    prompt: int
    audit: int
    policy: int


def subject_of(strategy: str, topic: str, title: str) -> str:
    """The subject of a record of `topic` whose schema is titled `title`, as Confluent's
    TopicNameStrategy, RecordNameStrategy and TopicRecordNameStrategy name it."""
    if strategy == "record":
        return title
    if strategy == "topic_record":
        return f"{topic}-{title}"
    return f"{topic}-value"


def contract_schemas(settings: Settings) -> list[ContractSchema]:
    """The contract's schemas for the settings' topics that carry one of its records: input,
    prompts, audit, policies."""
    schemas = []
    for topic in TOPICS:
        if topic.record is None:  # dead letters: the rejected input's own bytes
            continue
        name, schema = getattr(settings, topic.setting), topic.record.json_schema()
        subject = subject_of(settings.schema_registry_subject_strategy, name,
                             str(schema["title"]))
        schemas.append(ContractSchema(topic.record.name, name, subject, canonical(schema)))
    return schemas


def client_config(settings: Settings) -> dict[str, object]:
    """The client's configuration; the password is read from its file now."""
    assert settings.schema_registry_url is not None
    config: dict[str, object] = {
        "url": settings.schema_registry_url,
        "timeout": REQUEST_TIMEOUT_SECONDS,
        "max.retries": 0,  # the worker's own backoff retries, for as long as it takes
    }
    if settings.schema_registry_user is not None:
        assert settings.schema_registry_password_file is not None
        password = _read_secret(settings.schema_registry_password_file,
                                "ASSEMBLER_SCHEMA_REGISTRY_PASSWORD_FILE")
        config["basic.auth.user.info"] = f"{settings.schema_registry_user}:{password}"
    if settings.schema_registry_ca_file is not None:
        config["ssl.ca.location"] = str(settings.schema_registry_ca_file)
    return config


def _size(entry: tuple[Resolved, float]) -> int:
    resolved = entry[0]
    if isinstance(resolved, RegisteredSchema):
        return ENTRY_BYTES + VALIDATOR_BYTES_PER_BYTE * resolved.size
    return ENTRY_BYTES


def _not_found(error: SchemaRegistryError) -> bool:
    """The registry says it holds no such subject, version or schema."""
    return error.http_status_code == 404 and error.error_code in NOT_FOUND_CODES


def _problem(error: BaseException) -> str:
    if isinstance(error, SchemaRegistryError):
        problem = f"HTTP {error.http_status_code}: {error.error_message}"
        if error.http_status_code == 404:
            problem += (" (is ASSEMBLER_SCHEMA_REGISTRY_URL the registry's Confluent-compatible "
                        "base URL?)")
        return problem
    return f"{type(error).__name__}: {error}"


class SchemaRegistry:
    """The registry as the worker and the CLI use it. Its client is made in the event loop
    that first uses it (faust's worker runs in a loop of its own)."""

    def __init__(self, settings: Settings, cache_bytes: int = SCHEMA_CACHE_BYTES,
                 client: AsyncSchemaRegistryClient | None = None) -> None:
        """`client`: one to use in every loop (the tests' mock registry)."""
        self.settings = settings
        self._config = client_config(settings) if client is None else {}
        self._given = client
        self._client: AsyncSchemaRegistryClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.cache: SizedCache[int, tuple[Resolved, float]] = SizedCache(cache_bytes, _size)

    @property
    def client(self) -> AsyncSchemaRegistryClient:
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = AsyncSchemaRegistryClient(self._config)
            self._loop = loop
        return self._client

    async def close(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None

    async def resolve(self, ids: Iterable[int]) -> dict[int, Resolved]:
        """The schema each id names, or why it cannot be used: from the cache, or fetched
        together. Raises RegistryUnavailable if the registry did not answer for one."""
        now = time.monotonic()
        resolved: dict[int, Resolved] = {}
        wanted = []
        for schema_id in set(ids):
            cached = self.cache.get(schema_id)
            if cached is not None and cached[1] > now:
                resolved[schema_id] = cached[0]
            else:
                wanted.append(schema_id)
        if not wanted:
            return resolved
        try:
            fetched = await asyncio.gather(*(self._fetch(schema_id) for schema_id in wanted))
        finally:
            await self.client.clear_caches()  # type: ignore[no-untyped-call]  # see above
        for item in fetched:
            expires = now + UNKNOWN_FOR_SECONDS if isinstance(item, UnknownSchema) else float("inf")
            self.cache.put(item.schema_id, (item, expires))
            resolved[item.schema_id] = item
        return resolved

    async def _fetch(self, schema_id: int) -> Resolved:
        try:
            schema = await self.client.get_schema(schema_id)
        except SchemaRegistryError as error:
            if _not_found(error):
                return UnknownSchema(schema_id, "not found in the schema registry")
            raise RegistryUnavailable(f"schema id {schema_id}: {_problem(error)}") from error
        except Exception as error:  # the client's transport errors (connection, timeout)
            raise RegistryUnavailable(f"schema id {schema_id}: {_problem(error)}") from error
        return _compiled(schema_id, schema)

    async def output_ids(self, register: bool) -> OutputIds:
        """The ids of the output schemas under their subjects: looked up, or registered if
        `register`. Raises NotRegistered (an operator's fix), RegistryUnavailable (retry)."""
        ids = {}
        for contract in contract_schemas(self.settings)[1:]:
            try:
                if register:
                    ids[contract.name] = await self.client.register_schema(
                        contract.subject, contract.schema)
                else:
                    found = await self.client.lookup_schema(contract.subject, contract.schema)
                    assert found.schema_id is not None
                    ids[contract.name] = found.schema_id
            except SchemaRegistryError as error:
                if _not_found(error):
                    raise NotRegistered(
                        f"subject {contract.subject} does not hold this version's "
                        f"{contract.name} schema: register it with `context-assembler schemas "
                        "register` (or set ASSEMBLER_SCHEMA_REGISTRY_AUTO_REGISTER=true)"
                    ) from error
                raise RegistryUnavailable(f"{contract.subject}: {_problem(error)}") from error
            except Exception as error:
                raise RegistryUnavailable(f"{contract.subject}: {_problem(error)}") from error
        return OutputIds(ids["assembled-prompt"], ids["assembly-audit"], ids["policy-record"])

    async def register(self) -> list[tuple[ContractSchema, int]]:
        """Register each contract schema under its subject, once every one passed the
        subject's compatibility check (a new subject has none). Raises Incompatible naming
        the subjects that refused, before registering anything; RegistryUnavailable if the
        registry did not answer or refused a registration."""
        try:
            return await self._register()
        except (Incompatible, RegistryUnavailable):
            raise
        except Exception as error:  # refused (401, 403, 409, 422) or not answered
            raise RegistryUnavailable(_problem(error)) from error

    async def _register(self) -> list[tuple[ContractSchema, int]]:
        refused = []
        for contract in contract_schemas(self.settings):
            try:
                compatible = await self.client.test_compatibility(contract.subject,
                                                                  contract.schema)
            except SchemaRegistryError as error:
                if not _not_found(error):
                    raise RegistryUnavailable(f"{contract.subject}: {_problem(error)}") from error
                # a new subject (Confluent's answer; Apicurio's is True): nothing to break
                compatible = True
            if not compatible:
                refused.append(contract.subject)
        if refused:
            raise Incompatible("incompatible with the versions the registry holds under "
                               f"{', '.join(refused)}: nothing was registered")
        return [(contract, await self.client.register_schema(contract.subject, contract.schema))
                for contract in contract_schemas(self.settings)]


def _compiled(schema_id: int, schema: Schema) -> Resolved:
    """The registered schema, checked for what a record may make the worker hold."""
    kind = schema.schema_type or "AVRO"  # the registry leaves the type out for Avro
    if kind != SCHEMA_TYPE:
        return UnknownSchema(schema_id, f"a schema of type {kind}, not JSON")
    if schema.references:
        return UnknownSchema(schema_id, "refers to other schemas, which are not followed")
    text = schema.schema_str or ""
    size = len(text.encode())
    if size > MAX_SCHEMA_BYTES:
        return UnknownSchema(schema_id, f"{size} bytes, over the {MAX_SCHEMA_BYTES} a schema "
                             "may have here")
    try:
        return RegisteredSchema.compile(schema_id, text)
    except InvalidSchema as error:
        return UnknownSchema(schema_id, f"not a valid JSON Schema: {str(error)[:200]}")


async def output_ids_at_start(registry: SchemaRegistry, stop: asyncio.Event,
                              problems: list[str]) -> OutputIds | None:
    """The output ids (registered first, if auto-registration is on), retried with backoff
    while the registry does not answer; None if `stop` came first. Each new problem is
    logged once and appended to `problems` (for /ready). Raises NotRegistered."""
    settings = registry.settings
    delay = 0.5
    while not stop.is_set():
        try:
            return await registry.output_ids(settings.schema_registry_auto_register)
        except RegistryUnavailable as error:
            problem = f"the schema registry: {error}"
            if not problems or problems[-1] != problem:
                log.error("cannot look the output schemas up, so not consuming yet: %s", error)
                problems.append(problem)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
        delay = min(delay * 2, settings.retry_backoff_max_seconds)
    return None
