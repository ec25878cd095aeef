"""Small builders for test events: only the fields a test cares about."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from context_assembler.contract.models import Chunk, RetrievalResult
from context_assembler.engine.policy import Policy, policy_from_mapping

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def chunk(chunk_id: str, text: str, **fields: Any) -> Chunk:
    return Chunk.model_validate({"chunk_id": chunk_id, "text": text, **fields})


def event(chunks: list[Chunk], question: str = "What is the answer?", **fields: Any) -> RetrievalResult:
    return RetrievalResult.model_validate(
        {"request_id": fields.pop("request_id", "req-1"), "question": question,
         "chunks": [c.model_dump() for c in chunks], **fields}
    )


def policy(**sections: dict[str, Any]) -> Policy:
    return policy_from_mapping(sections)


def example_events() -> dict[str, dict[str, Any]]:
    lines = (EXAMPLES / "events.jsonl").read_text("utf-8").splitlines()
    return {e["request_id"]: e for e in map(json.loads, lines)}


def example(request_id: str) -> RetrievalResult:
    return RetrievalResult.model_validate(example_events()[request_id])


def naming_policy(line: bytes, name: str) -> bytes:
    """An example event line that names the policy `name` (no shipped example names one)."""
    return json.dumps({**json.loads(line), "policy": name}).encode()
