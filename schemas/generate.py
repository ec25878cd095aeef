"""Write the JSON Schema and AsyncAPI files from the pydantic models.

`python -m schemas.generate` rewrites them; `python -m schemas.generate --check` fails when
the committed files differ from what the models say (the test suite runs the check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from schemas.models import AssembledPrompt, AssemblyAudit, ErrorRecord, RetrievalResult

HERE = Path(__file__).parent
RECORDS: dict[str, type[BaseModel]] = {
    "retrieval-result": RetrievalResult,
    "assembled-prompt": AssembledPrompt,
    "assembly-audit": AssemblyAudit,
    "error-record": ErrorRecord,
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
        ".original.sha256 headers. The file mode writes an ErrorRecord line instead.",
    ),
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


def asyncapi() -> dict[str, Any]:
    messages: dict[str, Any] = {
        name: {"name": name, "contentType": "application/json",
               "payload": {"$ref": f"./{name}.schema.json"}}
        for name in RECORDS
    }
    messages["dead-letter"] = {
        "name": "dead-letter",
        "contentType": "application/octet-stream",
        "payload": {
            "description": "The rejected input, byte for byte; only its first bytes when "
            "the context-assembler.truncated header is true."
        },
        "headers": {
            "type": "object",
            "properties": {
                **{f"__connect.errors.{name}": {"type": "string"} for name in DEAD_LETTER_HEADERS},
                **TRUNCATION_HEADERS,
            },
        },
    }
    channels = {
        topic: {
            "address": topic,
            "messages": {message: {"$ref": f"#/components/messages/{message}"}},
            "description": text,
        }
        for topic, (_, message, text) in CHANNELS.items()
    }
    operations = {
        f"{action}-{topic.replace('.', '-')}": {
            "action": action,
            "channel": {"$ref": f"#/channels/{topic}"},
            "summary": text,
        }
        for topic, (action, _, text) in CHANNELS.items()
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "Context Assembler",
            "version": "1",
            "description": "Records keyed by request_id. Same event and policy: same bytes.",
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def rendered() -> dict[Path, str]:
    files = {
        HERE / f"{name}.schema.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in json_schemas().items()
    }
    # JSON is valid YAML 1.2: the AsyncAPI file needs no YAML writer to stay canonical.
    files[HERE / "asyncapi.yaml"] = json.dumps(asyncapi(), indent=2) + "\n"
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args()
    stale = [p for p, text in rendered().items() if not p.exists() or p.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run python -m schemas.generate)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in rendered().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
