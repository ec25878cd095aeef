"""Write the JSON Schema, AsyncAPI and OpenAPI files from the pydantic models.

`python -m context_assembler.contract.generate` (`make schemas`) rewrites them, and records
the JSON Schemas of the current schema_version under `schemas/history/v<N>/` the first time
that version (or a record new in it) is generated. With `--check` it fails when the
committed files differ from what the models say, or when a JSON Schema breaks what
readers of the same schema_version's snapshot rely on (`compat`); the test suite runs both
checks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from context_assembler.contract.compat import Direction, breaking_changes
from context_assembler.contract.models import (
    SCHEMA_VERSION,
    AssembledPrompt,
    AssemblyAudit,
    CitationCheck,
    CitationRequest,
    ErrorRecord,
    PolicyRecord,
    RetrievalResult,
)

# The repository's contract files (schemas/ beside worker/): this module is a development tool.
HERE = Path(__file__).resolve().parents[3] / "schemas"
HISTORY = HERE / "history"
RECORDS: dict[str, type[BaseModel]] = {
    "retrieval-result": RetrievalResult,
    "assembled-prompt": AssembledPrompt,
    "assembly-audit": AssemblyAudit,
    "error-record": ErrorRecord,
    "policy-record": PolicyRecord,
}
# The default topic names; deployments may rename them (worker settings).
CHANNELS = {
    "retrieval.results": ("receive", "retrieval-result", "Reranked passages for one chat request."),
    "prompts.assembled": ("send", "assembled-prompt", "The prompt for the generation service."),
    "context.audit": ("send", "assembly-audit", "What was kept and dropped, and why."),
    "retrieval.results.dlq": (
        "send",
        "dead-letter",
        "Inputs that could not be assembled (or whose prompt or audit was too large to "
        "publish: output_too_large): the original key, bytes and headers, plus Kafka "
        "Connect's __connect.errors.* headers naming the origin (topic, partition, offset), "
        "the stage and the error. A dead letter over the size limit carries only the first "
        "bytes of the input, with context-assembler.truncated, .original.bytes and "
        ".original.sha256 headers. The file mode writes an ErrorRecord line instead. "
        "A dead letter sent back by `context-assembler redrive` carries "
        "context-assembler.redrive.count, which its next dead letter keeps.",
    ),
    "assembler.policies": (
        "send",
        "policy-record",
        "Compacted, keyed by policy hash: every policy the worker assembles under, published "
        "before it consumes, so replay and explain find the rules an output's hash names.",
    ),
}


# Who reads each record: the engine reads inputs (producers may send anything the snapshot
# allowed), other services read outputs (they may rely on anything the snapshot promised).
DIRECTIONS: dict[str, Direction] = {
    "retrieval-result": "input",
    "assembled-prompt": "output",
    "assembly-audit": "output",
    "error-record": "output",
    "policy-record": "output",
}


def json_schemas() -> dict[str, dict[str, Any]]:
    return {name: model.model_json_schema() for name, model in RECORDS.items()}


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
REQUEST_ID_KEY = {"type": "string", "description": "The request_id, UTF-8."}
# AsyncAPI's Kafka bindings (github.com/asyncapi/bindings, kafka): the version of their fields.
KAFKA_BINDING = {"bindingVersion": "0.5.0"}
# The defaults of the worker's settings and of `context-assembler topics create`; a test
# (tests/kafka/tools/test_topics.py) checks them against both.
DEFAULT_BOOTSTRAP_SERVERS = "127.0.0.1:9092"
DEFAULT_GROUP_ID = "context-assembler"
DEFAULT_PARTITIONS = 6
DEFAULT_MAX_MESSAGE_BYTES = 1_048_576
DAY_MS = 24 * 60 * 60 * 1000
#: Per channel: the record key, the retention and cleanup `topics create` gives the topic.
TOPIC_BINDINGS: dict[str, tuple[dict[str, str], int, str]] = {
    "retrieval.results": (
        {**REQUEST_ID_KEY, "description": "The request_id, UTF-8, as `context-assembler "
         "produce` keys it (any key is accepted; the worker reads the value)."},
        7 * DAY_MS, "delete"),
    "prompts.assembled": (REQUEST_ID_KEY, 7 * DAY_MS, "delete"),
    "context.audit": (REQUEST_ID_KEY, 30 * DAY_MS, "delete"),
    "retrieval.results.dlq": (
        {"type": "string", "description": "The input's own key, unchanged (none if it had "
         "none, or if a dead letter had to be cut to its headers)."},
        30 * DAY_MS, "delete"),
    "assembler.policies": (
        {"type": "string", "pattern": "^sha256:[0-9a-f]{16}$",
         "description": "The policy hash the audits name (policy.hash)."},
        30 * DAY_MS, "compact"),
}


# Optional, with a schema registry: the payload is this JSON framed as Confluent's serializers
# frame it, and either is read (docs/schema-registry.md).
FRAMING = ("JSON, or with a schema registry (ASSEMBLER_SCHEMA_REGISTRY_URL) the same JSON in "
           "the Confluent wire format: byte 0, the registered schema id as 4 bytes big-endian, "
           "then the JSON. Readers take either.")


def _headers(properties: dict[str, dict[str, str]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _channel(topic: str, message: str, text: str) -> dict[str, Any]:
    _, retention_ms, cleanup = TOPIC_BINDINGS[topic]
    return {
        "address": topic,
        "messages": {message: {"$ref": f"#/components/messages/{message}"}},
        "description": text,
        "bindings": {"kafka": {
            "topic": topic,
            "partitions": DEFAULT_PARTITIONS,
            "topicConfiguration": {"cleanup.policy": [cleanup], "retention.ms": retention_ms,
                                   "max.message.bytes": DEFAULT_MAX_MESSAGE_BYTES},
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
    for topic, (_, message, _) in CHANNELS.items():
        messages[message]["bindings"] = {"kafka": {"key": TOPIC_BINDINGS[topic][0],
                                                   **KAFKA_BINDING}}
    channels = {topic: _channel(topic, message, text)
                for topic, (_, message, text) in CHANNELS.items()}
    operations: dict[str, Any] = {
        f"{action}-{topic.replace('.', '-')}": {
            "action": action,
            "channel": {"$ref": f"#/channels/{topic}"},
            "summary": text,
        }
        for topic, (action, _, text) in CHANNELS.items()
    }
    for operation in operations.values():
        if operation["action"] == "receive":
            operation["bindings"] = {"kafka": {
                "groupId": {"type": "string", "default": DEFAULT_GROUP_ID,
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
                    "default": DEFAULT_BOOTSTRAP_SERVERS,
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
        *(model for model in RECORDS.values() if model is not PolicyRecord),
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
            "prompt": refs[(AssembledPrompt, "validation")],
            "audit": refs[(AssemblyAudit, "validation")],
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
                    "schema": refs[(RetrievalResult, "validation")]}}},
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


def canonical(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def rendered() -> dict[Path, str]:
    files = {
        HERE / f"{name}.schema.json": canonical(schema) for name, schema in json_schemas().items()
    }
    # JSON is valid YAML 1.2: the AsyncAPI file needs no YAML writer to stay canonical.
    files[HERE / "asyncapi.yaml"] = json.dumps(asyncapi(), indent=2) + "\n"
    files[HERE / "openapi.json"] = canonical(openapi())
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
