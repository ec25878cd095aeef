"""The records and topics of the contract, each declared once.

A record is a model and the JSON Schema file it is published as; a topic is the setting that
names it, its default name, the record it carries, the worker's part in it (reads or writes)
and the retention and cleanup `topics create` gives it. The settings take their defaults from
here, `topics create` its topics, the AsyncAPI writer its channels, and the schema registry
its subjects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel

from context_assembler.contract.compat import Direction
from context_assembler.contract.models import (
    AssembledPrompt,
    AssemblyAudit,
    ErrorRecord,
    PolicyRecord,
    RetrievalResult,
)


@dataclass(frozen=True)
class Record:
    """A record of the contract: `schemas/<name>.schema.json` is its model's JSON Schema.
    `direction`: who reads it, so what a change may break (`compat`)."""

    name: str
    model: type[BaseModel]
    direction: Direction

    def json_schema(self) -> dict[str, Any]:
        return self.model.model_json_schema()


RETRIEVAL_RESULT: Final = Record("retrieval-result", RetrievalResult, "input")
ASSEMBLED_PROMPT: Final = Record("assembled-prompt", AssembledPrompt, "output")
ASSEMBLY_AUDIT: Final = Record("assembly-audit", AssemblyAudit, "output")
ERROR_RECORD: Final = Record("error-record", ErrorRecord, "output")  # the file mode's
POLICY_RECORD: Final = Record("policy-record", PolicyRecord, "output")
RECORDS: Final = (RETRIEVAL_RESULT, ASSEMBLED_PROMPT, ASSEMBLY_AUDIT, ERROR_RECORD,
                  POLICY_RECORD)


def canonical(document: Mapping[str, Any]) -> str:
    """A JSON document as the schema files hold it, and as it is registered."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


DAY_MS: Final = 24 * 60 * 60 * 1000
# Kafka's default retention; dead letters, audits and policies are kept longer, for whoever
# looks late.
OUTPUT_RETENTION_MS: Final = 7 * DAY_MS
LONG_RETENTION_MS: Final = 30 * DAY_MS
DEFAULT_PARTITIONS: Final = 6
REQUEST_ID_KEY: Final = {"type": "string", "description": "The request_id, UTF-8."}


@dataclass(frozen=True)
class Topic:
    """A topic the worker reads or writes."""

    setting: str  # the Settings field that names it
    default: str  # its name unless that setting says otherwise
    role: Literal["receive", "send"]  # the worker's part in it
    record: Record | None  # None: the dead letters, each the rejected input's own bytes
    usage: str  # what goes through it, as the setting's description says
    summary: str  # what goes through it, as the AsyncAPI channel says
    key: Mapping[str, str]  # the record key's JSON Schema
    retention_ms: int
    cleanup: Literal["delete", "compact"] = "delete"

    @property
    def message(self) -> str:
        return self.record.name if self.record is not None else "dead-letter"


TOPICS: Final[tuple[Topic, ...]] = (
    Topic(
        "input_topic", "retrieval.results", "receive", RETRIEVAL_RESULT,
        "The RetrievalResult events the worker reads.",
        "Reranked passages for one chat request.",
        {**REQUEST_ID_KEY, "description": "The request_id, UTF-8, as `context-assembler "
         "produce` keys it (any key is accepted; the worker reads the value)."},
        OUTPUT_RETENTION_MS),
    Topic(
        "prompts_topic", "prompts.assembled", "send", ASSEMBLED_PROMPT,
        "Where the worker publishes each prompt.",
        "The prompt for the generation service.", REQUEST_ID_KEY, OUTPUT_RETENTION_MS),
    Topic(
        "audit_topic", "context.audit", "send", ASSEMBLY_AUDIT,
        "Where the worker publishes each prompt's audit.",
        "What was kept and dropped, and why.", REQUEST_ID_KEY, LONG_RETENTION_MS),
    Topic(
        "dlq_topic", "retrieval.results.dlq", "send", None,
        "Where the worker publishes each event it cannot assemble (dead letters).",
        "Inputs that could not be assembled (or whose prompt or audit was too large to "
        "publish: output_too_large): the original key, bytes and headers, plus Kafka "
        "Connect's __connect.errors.* headers naming the origin (topic, partition, offset), "
        "the stage and the error. A dead letter over the size limit carries only the first "
        "bytes of the input, with context-assembler.truncated, .original.bytes and "
        ".original.sha256 headers. The file mode writes an ErrorRecord line instead. "
        "A dead letter sent back by `context-assembler redrive` carries "
        "context-assembler.redrive.count, which its next dead letter keeps.",
        {"type": "string", "description": "The input's own key, unchanged (none if it had "
         "none, or if a dead letter had to be cut to its headers)."},
        LONG_RETENTION_MS),
    Topic(
        "policies_topic", "assembler.policies", "send", POLICY_RECORD,
        "Compacted: each policy the worker assembles under, keyed by its hash, published "
        "before any event is consumed (replay --policy recorded reads it).",
        "Compacted, keyed by policy hash: every policy the worker assembles under, published "
        "before it consumes, so replay and explain find the rules an output's hash names.",
        {"type": "string", "pattern": "^sha256:[0-9a-f]{16}$",
         "description": "The policy hash the audits name (policy.hash)."},
        LONG_RETENTION_MS, "compact"),
)
TOPIC_SETTINGS: Final = tuple(topic.setting for topic in TOPICS)


def topic_named_by(setting: str) -> Topic:
    """The topic the setting `setting` names."""
    return next(topic for topic in TOPICS if topic.setting == setting)


# Kafka's own rule for a topic name (org.apache.kafka.common.internals.Topic): so no `*`,
# the wildcard of an ACL, and nothing a shell or a YAML file would read otherwise.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
TOPIC_RULE: Final = ("letters, digits, '.', '_' and '-', 1 to 249 characters, not '.' or '..' "
                     "(Kafka's rule)")


def topic_problem(name: str) -> str | None:
    """Why Kafka would refuse `name` as a topic name, None if it takes it."""
    if _TOPIC_NAME.fullmatch(name) and name not in (".", ".."):
        return None
    return f"{name!r} is not a topic name: {TOPIC_RULE}"
