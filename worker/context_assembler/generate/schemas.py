"""Write the JSON Schema, AsyncAPI and OpenAPI files from the pydantic models and the catalogue.

`python -m context_assembler.generate.schemas` (`make schemas`) rewrites them, and records
the JSON Schemas of the current schema_version under `schemas/history/v<N>/` the first time
that version (or a record new in it) is generated. With `--check` it fails when the
committed files differ from what the models say, or when a JSON Schema breaks what
readers of the same schema_version's snapshot rely on (`compat`); the test suite runs both
checks. Nothing the worker, serve or the CLI runs imports this module: serve answers
/openapi.json with the copy written into the package.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from context_assembler.contract.catalogue import (
    ASSEMBLED_PROMPT,
    ASSEMBLY_AUDIT,
    DEFAULT_PARTITIONS,
    POLICY_RECORD,
    RETRIEVAL_RESULT,
    TOPICS,
    Topic,
    canonical,
)
from context_assembler.contract.catalogue import RECORDS as CONTRACT_RECORDS
from context_assembler.contract.compat import Direction, breaking_changes
from context_assembler.contract.models import SCHEMA_VERSION, CitationCheck, CitationRequest
from context_assembler.settings import Settings

# The repository's contract files (schemas/ beside worker/): this module is a development tool.
HERE = Path(__file__).resolve().parents[3] / "schemas"
HISTORY = HERE / "history"
# The OpenAPI document as serve answers /openapi.json: package data, the same bytes.
SERVED_OPENAPI = Path(__file__).resolve().parents[1] / "serve" / "openapi.json"
RECORDS: dict[str, type[BaseModel]] = {record.name: record.model for record in CONTRACT_RECORDS}
DIRECTIONS: dict[str, Direction] = {record.name: record.direction
                                    for record in CONTRACT_RECORDS}


def json_schemas() -> dict[str, dict[str, Any]]:
    return {record.name: record.json_schema() for record in CONTRACT_RECORDS}


DEAD_LETTER_HEADERS = [
    "topic", "partition", "offset", "connector.name", "stage", "class.name",
    "exception.class.name", "exception.message",
]

TRUNCATION_HEADERS: dict[str, dict[str, str]] = {
    "context-assembler.truncated": {
        "type": "string", "description": "\"true\": the payload is the input's first bytes."},
    "context-assembler.original.bytes": {
        "type": "string", "description": "Length of the whole input in bytes."},
    "context-assembler.original.sha256": {
        "type": "string", "description": "sha256 of the whole input, hex."},
}


TRACEPARENT_HEADER = {
    "traceparent": {
        "type": "string",
        "description": "W3C trace context of the request, if its producer set a valid one: the "
        "worker continues it, and copies it unchanged onto the prompt and the audit (an "
        "invalid one is not copied)."},
}
#: The headers a prompt and an audit carry: where their input was read (kafka/records.py).
SOURCE_HEADERS: dict[str, dict[str, str]] = {
    "context-assembler.source.topic": {
        "type": "string", "description": "The input's topic."},
    "context-assembler.source.partition": {
        "type": "string", "pattern": "^[0-9]+$", "description": "The input's partition."},
    "context-assembler.source.offset": {
        "type": "string", "pattern": "^[0-9]+$", "description": "The input's offset."},
}
# AsyncAPI's Kafka bindings (github.com/asyncapi/bindings, kafka): the version of their fields.
KAFKA_BINDING = {"bindingVersion": "0.5.0"}


def _default(setting: str) -> Any:
    return Settings.model_fields[setting].get_default()


# Optional, with a schema registry: the payload is this JSON framed as Confluent's serializers
# frame it, and either is read (docs/schema-registry.md).
FRAMING = ("JSON, or with a schema registry (ASSEMBLER_SCHEMA_REGISTRY_URL) the same JSON in "
           "the Confluent wire format: byte 0, the registered schema id as 4 bytes big-endian, "
           "then the JSON. Readers take either.")


def _headers(properties: dict[str, dict[str, str]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _channel(topic: Topic) -> dict[str, Any]:
    return {
        "address": topic.default,
        "messages": {topic.message: {"$ref": f"#/components/messages/{topic.message}"}},
        "description": topic.summary,
        "bindings": {"kafka": {
            "topic": topic.default,
            "partitions": DEFAULT_PARTITIONS,
            "topicConfiguration": {"cleanup.policy": [topic.cleanup],
                                   "retention.ms": topic.retention_ms,
                                   "max.message.bytes": _default("max_message_bytes")},
            **KAFKA_BINDING,
        }},
    }


def asyncapi() -> dict[str, Any]:
    messages: dict[str, Any] = {
        name: {"name": name, "contentType": "application/json",
               "description": FRAMING,
               "payload": {"$ref": f"./{name}.schema.json"}}
        for name in RECORDS
    }
    messages["retrieval-result"]["headers"] = _headers({**TRACEPARENT_HEADER, "tracestate": {
        "type": "string", "description": "W3C trace state, read with traceparent when tracing "
        "is on; not copied onto the outputs."}}, [])
    for name in ("assembled-prompt", "assembly-audit"):
        messages[name]["headers"] = _headers({**SOURCE_HEADERS, **TRACEPARENT_HEADER},
                                             list(SOURCE_HEADERS))
    messages["dead-letter"] = {
        "name": "dead-letter",
        "contentType": "application/octet-stream",
        "payload": {
            "description": "The rejected input, byte for byte; only its first bytes when "
            "the context-assembler.truncated header is true."
        },
        "headers": {
            **_headers({
                **{f"__connect.errors.{name}": {"type": "string"}
                   for name in DEAD_LETTER_HEADERS},
                **TRUNCATION_HEADERS,
                "context-assembler.redrive.count": {
                    "type": "string", "description": "How often `context-assembler redrive` "
                    "sent this input back already (absent: never)."},
                **TRACEPARENT_HEADER,
            }, [f"__connect.errors.{name}" for name in DEAD_LETTER_HEADERS]),
            "description": "The input's own headers, then Kafka Connect's error headers.",
        },
    }
    for topic in TOPICS:
        messages[topic.message]["bindings"] = {"kafka": {"key": dict(topic.key),
                                                         **KAFKA_BINDING}}
    channels = {topic.default: _channel(topic) for topic in TOPICS}
    operations: dict[str, Any] = {
        f"{topic.role}-{topic.default.replace('.', '-')}": {
            "action": topic.role,
            "channel": {"$ref": f"#/channels/{topic.default}"},
            "summary": topic.summary,
        }
        for topic in TOPICS
    }
    for operation in operations.values():
        if operation["action"] == "receive":
            operation["bindings"] = {"kafka": {
                "groupId": {"type": "string", "default": _default("group_id"),
                            "description": "ASSEMBLER_GROUP_ID: the workers share the "
                            "partitions of one group."},
                **KAFKA_BINDING,
            }}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Context Assembler",
            "version": "1",
            "description": "Records keyed by request_id. Same event and policy: same bytes.",
        },
        "servers": {
            "kafka": {
                "host": "{bootstrapServers}",
                "protocol": "kafka",
                "description": "The Kafka cluster the workers' ASSEMBLER_BOOTSTRAP_SERVERS "
                "names. Topic names, partitions and retention are the defaults of the "
                "worker's settings and of `context-assembler topics create`.",
                "variables": {"bootstrapServers": {
                    "default": _default("bootstrap_servers"),
                    "description": "host:port of a broker (ASSEMBLER_BOOTSTRAP_SERVERS)."}},
                "bindings": {"kafka": KAFKA_BINDING},
            },
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def _error_body() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["reason", "message"],
        "properties": {
            "reason": {"$ref": "#/components/schemas/RejectReason"},
            "message": {"type": "string"},
            "request_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
    }


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Rejected"}}},
    }


def openapi() -> dict[str, Any]:
    """The HTTP endpoint (`context-assembler serve`), its bodies the contract's models."""
    models: list[type[BaseModel]] = [
        *(model for model in RECORDS.values() if model is not POLICY_RECORD.model),
        CitationRequest, CitationCheck,
    ]
    refs, defs = models_json_schema(
        [(model, "validation") for model in models],
        ref_template="#/components/schemas/{model}",
    )
    schemas = dict(defs["$defs"])
    schemas["Rejected"] = _error_body()
    schemas["Assembled"] = {
        "type": "object",
        "required": ["prompt", "audit"],
        "properties": {
            "prompt": refs[(ASSEMBLED_PROMPT.model, "validation")],
            "audit": refs[(ASSEMBLY_AUDIT.model, "validation")],
        },
        "description": "The prompt and audit, each byte for byte as the file mode writes it.",
    }
    text = {"content": {"text/plain": {"schema": {"type": "string"}}}}
    status = {"type": "object", "additionalProperties": {"type": "boolean"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Context Assembler",
            "version": str(SCHEMA_VERSION),
            "description": "Same event and policy: same bytes, as in the file mode and on Kafka.",
        },
        "paths": {
            "/v1/assemble": {"post": {
                "operationId": "assemble",
                "summary": "One RetrievalResult in, its prompt and audit out.",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": refs[(RETRIEVAL_RESULT.model, "validation")]}}},
                "responses": {
                    "200": {"description": "Assembled.", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Assembled"}}}},
                    "400": _error("Not valid HTTP, a body whose chunked or gzip framing is "
                                  "broken, not UTF-8 or not strict JSON (reason json)."),
                    "408": _error("The body did not arrive within the body timeout of the "
                                  "request's head (reason limits)."),
                    "413": _error("Body over max_event_bytes, after any Content-Encoding is "
                                  "decoded; a byte-order mark opening it is not counted "
                                  "(reason limits)."),
                    "415": _error("Content-Type is not JSON in UTF-8 (reason json); none "
                                  "is taken for application/json."),
                    "422": _error("Valid JSON that cannot be assembled: schema, limits, a "
                                  "policy not allowed, a question over the window (budget)."),
                    "500": _error("A bug in the engine (reason engine)."),
                    "503": {"description": "Busy: max_pending requests wait for the "
                            "engine, or the bodies held fill their room; retry after the "
                            "Retry-After header's seconds.", "content": {
                                "application/json": {"schema": {
                                    "type": "object", "required": ["message"],
                                    "properties": {"message": {"type": "string"}}}}}},
                },
            }},
            "/v1/citations/check": {"post": {
                "operationId": "checkCitations",
                "summary": "A published prompt and its answer in: what the answer cites.",
                "description": "The answer is its text (\"[label]\" markers are read) or a "
                "provider's response body (Anthropic Messages, Cohere Chat v2: their citation "
                "objects are read). The body may be twice max_event_bytes; the answer's text "
                "at most max_event_bytes characters.",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": refs[(CitationRequest, "validation")]}}},
                "responses": {
                    "200": {"description": "Checked.", "content": {"application/json": {
                        "schema": refs[(CitationCheck, "validation")]}}},
                    "400": _error("Not valid HTTP, or not UTF-8 strict JSON (reason json)."),
                    "408": _error("The body did not arrive within the body timeout of the "
                                  "request's head (reason limits)."),
                    "413": _error("Body over twice max_event_bytes (reason limits)."),
                    "415": _error("Content-Type is not JSON in UTF-8 (reason json)."),
                    "422": _error("Not a prompt and an answer the check reads (reason "
                                  "schema), or an answer over its bounds: its text over "
                                  "max_event_bytes characters, more than 4096 citations, a "
                                  "result over 32 times what was read (reason limits)."),
                    "503": {"description": "Busy, as for /v1/assemble.", "content": {
                        "application/json": {"schema": {
                            "type": "object", "required": ["message"],
                            "properties": {"message": {"type": "string"}}}}}},
                },
            }},
            "/metrics": {"get": {"operationId": "metrics", "summary": "Prometheus metrics.",
                                 "responses": {"200": {"description": "Metrics.", **text}}}},
            "/health": {"get": {"operationId": "health", "summary": "The process answers.",
                                "responses": {"200": {"description": "Alive.", "content": {
                                    "application/json": {"schema": {"type": "object"}}}}}}},
            "/ready": {"get": {"operationId": "ready", "summary": "Accepting requests.",
                               "responses": {
                                   "200": {"description": "Ready.", "content": {
                                       "application/json": {"schema": status}}},
                                   "503": {"description": "Stopping.", "content": {
                                       "application/json": {"schema": status}}}}}},
            "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document.",
                                      "responses": {"200": {"description": "OpenAPI 3.1."}}}},
        },
        "components": {"schemas": schemas},
    }


def rendered() -> dict[Path, str]:
    files = {
        HERE / f"{name}.schema.json": canonical(schema) for name, schema in json_schemas().items()
    }
    # JSON is valid YAML 1.2: the AsyncAPI file needs no YAML writer to stay canonical.
    files[HERE / "asyncapi.yaml"] = json.dumps(asyncapi(), indent=2) + "\n"
    files[HERE / "openapi.json"] = files[SERVED_OPENAPI] = canonical(openapi())
    return files


def snapshot_dir(version: int | None = None) -> Path:
    """The JSON Schemas as `version` (default: the current one) first published them."""
    return HISTORY / f"v{SCHEMA_VERSION if version is None else version}"


def incompatibilities(
    current: dict[str, dict[str, Any]], snapshot: Path
) -> list[str]:
    """Every way `current` breaks the snapshot of the same schema_version, one line each.

    A record missing from `current` breaks its readers as well.
    """
    problems: list[str] = []
    for name, direction in DIRECTIONS.items():
        path = snapshot / f"{name}.schema.json"
        if not path.exists():
            continue
        old = json.loads(path.read_text("utf-8"))
        if name not in current:
            problems.append(f"{name}: removed")
            continue
        problems.extend(f"{name}: {p}" for p in breaking_changes(old, current[name], direction))
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="fail if the files are stale or break this schema_version")
    args = parser.parse_args()
    snapshot = snapshot_dir()
    breaking = incompatibilities(json_schemas(), snapshot)
    for problem in breaking:
        print(f"breaking change within schema_version {SCHEMA_VERSION}: {problem} (raise "
              "SCHEMA_VERSION in contract/models.py, or keep the change compatible)",
              file=sys.stderr)
    stale = [p for p, text in rendered().items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run make schemas)", file=sys.stderr)
        if not snapshot.exists():
            print(f"missing: {snapshot} (run make schemas)", file=sys.stderr)
        return 1 if stale or breaking or not snapshot.exists() else 0
    if breaking:
        return 1
    for path, text in rendered().items():
        path.write_text(text)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, schema in json_schemas().items():  # a new version or record: its first promise
        if not (snapshot / f"{name}.schema.json").exists():
            (snapshot / f"{name}.schema.json").write_text(canonical(schema))
    return 0


if __name__ == "__main__":
    sys.exit(main())
