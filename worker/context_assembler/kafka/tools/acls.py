"""The least-privilege ACLs of the worker's principal, for the configured topics, group and
transactional-id prefix: printed by `context-assembler acls` as `kafka-acls` commands or as
a Strimzi KafkaUser, and granted as they are by the secured-broker tests.

Nothing more: the worker reads no topic configs (its limits are settings), creates no topics
(`topics create` is an admin's job) and, its producers writing only to topics it may WRITE,
needs no cluster IDEMPOTENT_WRITE (Kafka 3.0 and later).
"""

from __future__ import annotations

import json
import re
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


# What Kubernetes takes as an object's name (DNS-1123 subdomain) and as a label's value.
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def principal_problem(principal: str) -> str | None:
    """Why `principal` cannot be granted the worker's ACLs: not User:NAME, the wildcard
    User:* (every user), or a name holding control, format or line-break characters."""
    name = principal.removeprefix("User:")
    if name == principal or not name.strip():
        return f"--principal {principal!r}: expected User:NAME"
    if name == "*":
        return (f"--principal {principal!r} is the wildcard (every user); name the worker's "
                "own principal")
    if not name.isprintable():
        return (f"--principal {principal!r}: a principal may not hold control or line-break "
                "characters")
    return None


def strimzi_problem(principal: str, cluster: str) -> str | None:
    """Why a KafkaUser for `principal` in `cluster` is not one Kubernetes accepts."""
    name = principal.removeprefix("User:").removeprefix("CN=")
    if len(name) > 253 or not _DNS_1123.fullmatch(name):
        return (f"--principal: {name!r} cannot name a KafkaUser: Kubernetes takes lower-case "
                "letters, digits, '-' and '.', starting and ending with a letter or digit, at "
                "most 253 characters (DNS-1123)")
    if len(cluster) > 63 or not _LABEL_VALUE.fullmatch(cluster):
        return (f"--strimzi-cluster {cluster!r} is not a label value: letters, digits, '-', "
                "'_' and '.', starting and ending with a letter or digit, at most 63 characters")
    return None


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
