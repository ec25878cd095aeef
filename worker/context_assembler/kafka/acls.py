"""The least-privilege ACLs of the worker's principal, for the configured topics, group and
transactional-id prefix: printed by `context-assembler acls` as `kafka-acls` commands or as
a Strimzi KafkaUser, and granted as they are by the secured-broker tests.

Nothing more: the worker reads no topic configs (its limits are settings), creates no topics
(`topics create` is an admin's job) and, its producers writing only to topics it may WRITE,
needs no cluster IDEMPOTENT_WRITE (Kafka 3.0 and later).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from context_assembler.settings import Settings


@dataclass(frozen=True)
class Acl:
    """ALLOW `operations` on one resource, from any host."""

    resource: str  # TOPIC, GROUP or TRANSACTIONAL_ID
    name: str
    pattern: str  # LITERAL or PREFIXED
    operations: tuple[str, ...]  # READ, WRITE, DESCRIBE

    def bindings(self) -> list[tuple[str, str, str, str]]:
        """One (resource, name, pattern, operation) per operation, as Kafka stores them."""
        return [(self.resource, self.name, self.pattern, op) for op in self.operations]


def worker_acls(settings: Settings) -> list[Acl]:
    acls = [
        Acl("TOPIC", settings.input_topic, "LITERAL", ("READ", "DESCRIBE")),
        Acl("GROUP", settings.group_id, "LITERAL", ("READ",)),
        *(Acl("TOPIC", topic, "LITERAL", ("WRITE", "DESCRIBE"))
          for topic in (settings.prompts_topic, settings.audit_topic, settings.dlq_topic,
                        settings.policies_topic)),
    ]
    if settings.processing_guarantee == "exactly_once":
        # <prefix><topic>-<partition>: one transactional id per input partition.
        acls.append(Acl("TRANSACTIONAL_ID", settings.transactional_id_prefix, "PREFIXED",
                        ("WRITE", "DESCRIBE")))
    return acls


_OPTIONS = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id"}


def kafka_acls_commands(principal: str, acls: list[Acl], bootstrap_servers: str) -> list[str]:
    """`kafka-acls --add` commands, one per resource, run by an admin principal (its client
    settings in admin.properties)."""
    commands = []
    for acl in acls:
        words = ["kafka-acls", "--bootstrap-server", bootstrap_servers,
                 "--command-config", "admin.properties", "--add", "--allow-principal", principal]
        for operation in acl.operations:
            words += ["--operation", operation.title().replace("_", "")]
        words += [_OPTIONS[acl.resource], acl.name]
        if acl.pattern == "PREFIXED":
            words += ["--resource-pattern-type", "prefixed"]
        commands.append(shlex.join(words))
    return commands


_STRIMZI_TYPES = {"TOPIC": "topic", "GROUP": "group", "TRANSACTIONAL_ID": "transactionalId"}


def strimzi_kafka_user(principal: str, acls: list[Acl], cluster: str) -> str:
    """A Strimzi KafkaUser granting the same ACLs. Strimzi names the principal after the
    user: User:NAME authenticates with SCRAM-SHA-512, User:CN=NAME with a TLS certificate.
    kafka.strimzi.io/v1, as the KafkaTopics `topics --format strimzi` prints."""
    name = principal.removeprefix("User:")
    authentication = "scram-sha-512"
    if name.startswith("CN="):
        name, authentication = name.removeprefix("CN="), "tls"
    lines = [
        "apiVersion: kafka.strimzi.io/v1",  # Strimzi 0.49 and later (1.0 serves only v1)
        "kind: KafkaUser",
        "metadata:",
        f"  name: {_yaml(name)}",
        "  labels:",
        f"    strimzi.io/cluster: {_yaml(cluster)}",
        "spec:",
        "  authentication:",
        f"    type: {authentication}",
        "  authorization:",
        "    type: simple",
        "    acls:",
    ]
    for acl in acls:
        lines += [
            "      - resource:",
            f"          type: {_STRIMZI_TYPES[acl.resource]}",
            f"          name: {_yaml(acl.name)}",
            f"          patternType: {acl.pattern.lower().replace('prefixed', 'prefix')}",
            "        operations: [" + ", ".join(op.title() for op in acl.operations) + "]",
            '        host: "*"',
        ]
    return "\n".join(lines)


def _yaml(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escaping is valid YAML)."""
    return json.dumps(text)
