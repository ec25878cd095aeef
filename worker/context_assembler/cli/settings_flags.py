"""Which settings each command reads, and the flag it offers for each.

The model (`context_assembler.settings`) declares each setting and its flag once; this table
says which of them each command reads, so its parser offers their flags, its help shows their
defaults, and docs/settings.md names the commands that read each one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pydantic.fields import FieldInfo

from context_assembler.contract.catalogue import TOPIC_SETTINGS
from context_assembler.intake.codec import Limits
from context_assembler.settings import Flag, Settings, flag_of

_SECURITY = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password",
             "sasl_password_file", "sasl_oauthbearer_token_file", "sasl_oauth_provider",
             "aws_region", "ssl_ca_file",
             "ssl_cert_file", "ssl_key_file", "ssl_key_password_file", "ssl_check_hostname")
_REGISTRY = ("schema_registry_url", "schema_registry_user", "schema_registry_password_file",
             "schema_registry_ca_file", "schema_registry_subject_strategy")
_KAFKA = ("bootstrap_servers", *_SECURITY, "max_batch_bytes")
_TOPICS = TOPIC_SETTINGS
_CACHES = ("cache_facts_bytes", "cache_words_bytes", "cache_tokens_bytes",
           "cache_sentences_bytes")
_ASSEMBLING = ("policy_file", "allowed_policies", *Limits.model_fields, *_CACHES)
_SERVING = ("serve_host", "serve_port", "max_pending", "body_timeout_seconds",
            "idle_timeout_seconds")
COMMANDS: Final[Mapping[str, tuple[str, ...]]] = {
    "assemble": _ASSEMBLING,
    "explain": (*_ASSEMBLING, *_KAFKA, "audit_topic", "policies_topic"),
    "sweep": _ASSEMBLING,
    "evaluate": (),  # its policies are its own repeatable --policy: each one is measured
    "worker": tuple(name for name in Settings.model_fields if name not in _SERVING),
    "acls": ("bootstrap_servers", *_TOPICS, "group_id", "processing_guarantee",
             "transactional_id"),
    "topics": ("bootstrap_servers", *_TOPICS, "max_message_bytes"),
    "topics create": (*_KAFKA, *_TOPICS, "max_message_bytes"),
    "produce": (*_KAFKA, "input_topic", "prompts_topic", "dlq_topic", "compression_type",
                "max_message_bytes"),
    "tail": (*_KAFKA, "prompts_topic", "audit_topic", "dlq_topic"),
    "replay": (*_KAFKA, *_ASSEMBLING, "input_topic", "prompts_topic", "audit_topic",
               "policies_topic", "compression_type", *_REGISTRY),
    "serve": (*_SERVING, "log_level", *_ASSEMBLING),
    "policy": ("policy_file", *_KAFKA, "policies_topic"),
    "redrive": (*_KAFKA, "dlq_topic", "input_topic", "max_message_bytes", "compression_type"),
    "citations": ("max_event_bytes",),
    "schemas register": (*_REGISTRY, *_TOPICS),
}
# A command may name a setting's flag its own way (produce sends to --topic), or offer none:
# replay's --policy may also say `recorded`, so it is replay's own option.
RENAMED_FLAGS: Final[Mapping[tuple[str, str], str | None]] = {
    ("produce", "input_topic"): "--topic",
    ("replay", "policy_file"): None,
}


def command_flag(name: str, command: str) -> Flag | None:
    """The flag of setting `name` as `command` names it, None if it offers none."""
    flag = flag_of(name)
    if flag is None or (command, name) not in RENAMED_FLAGS:
        return flag
    renamed = RENAMED_FLAGS[command, name]
    return None if renamed is None else Flag(renamed, flag.repeatable)


def command_options(command: str) -> dict[str, str | None]:
    """The settings `command` names its own way -> its option for each (None: none)."""
    return {name: option for (renamed, name), option in RENAMED_FLAGS.items()
            if renamed == command}


def shown_default(field: FieldInfo) -> str:
    """A setting's default as its help and the reference show it."""
    default = field.get_default()
    return "unset" if default in (None, ()) else str(default)
