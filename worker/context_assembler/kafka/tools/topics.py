"""`context-assembler topics create`: the worker's topics, as its settings name them.

The worker never creates topics (a misspelt name would silently become a new topic), so
operations create them with this command: `make broker-start`, docker-compose's `topics`
job and the Kubernetes Job all run it. Creating is idempotent; a topic that exists with
other partitions or configs is reported, never altered (that needs an operator's choice).
`context-assembler topics` prints the same topics for others to create: `kafka-topics`
commands, or Strimzi KafkaTopic resources for its Topic Operator.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    KafkaError,
    NodeNotReadyError,
    NoError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

from context_assembler.contract.catalogue import TOPICS
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.kafka.clients import (
    ACLS_HINT,
    REFUSED_CONNECTION,
    KafkaClients,
    connection_problem,
)
from context_assembler.kafka.errors import answered
from context_assembler.settings import Settings

log = logging.getLogger(__name__)

CREATE_COMMAND = "context-assembler topics create"
# With three replicas or more, a write is acknowledged once two hold it (acks=all): one broker
# may be down and nothing acknowledged is lost with the leader. Fewer replicas keep the
# broker's default, so a lone broker down does not stop every write.
MIN_INSYNC_REPLICAS = 2
MIN_INSYNC_FROM_REPLICATION = 3


class TopicError(ContextAssemblerError):
    """A topic the command needs is missing, or the broker cannot be reached or refuses."""


def missing_topic(topic: str) -> TopicError:
    return TopicError(f"topic {topic} does not exist; create it with `{CREATE_COMMAND}`")


def unreachable(servers: str) -> TopicError:
    return TopicError(f"cannot reach the Kafka broker at {servers} (bootstrap servers: "
                      "--bootstrap-servers or ASSEMBLER_BOOTSTRAP_SERVERS)")


async def refused(clients: KafkaClients) -> TopicError:
    """The error of a client that could not start: the broker's refusal of these
    credentials or certificates when that is the cause, else `unreachable`."""
    problem = await connection_problem(clients.servers, clients.security)
    return TopicError(problem) if problem else unreachable(clients.servers)


def not_authorized(topic: str, operation: str) -> TopicError:
    return TopicError(f"not authorized to {operation} topic {topic}: {ACLS_HINT}")


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)


def worker_topics(settings: Settings, partitions: int, replication_factor: int) -> list[TopicSpec]:
    """The topics the worker reads and writes, as the catalogue declares them and the
    settings name them. max.message.bytes is the worker's MAX_MESSAGE_BYTES, so the broker
    accepts every record the worker allows itself to send; min.insync.replicas is 2 where
    the replication factor leaves a broker to spare."""
    common = {"max.message.bytes": str(settings.max_message_bytes)}
    if replication_factor >= MIN_INSYNC_FROM_REPLICATION:
        common["min.insync.replicas"] = str(MIN_INSYNC_REPLICAS)
    specs = []
    for topic in TOPICS:
        configs = {**common, "retention.ms": str(topic.retention_ms)}
        if topic.cleanup != "delete":  # the broker's default
            configs["cleanup.policy"] = topic.cleanup
        specs.append(TopicSpec(getattr(settings, topic.setting), partitions,
                               replication_factor, configs))
    return specs


def kafka_topics_commands(specs: list[TopicSpec], bootstrap_servers: str) -> list[str]:
    """`kafka-topics --create` commands, one per topic, run by an admin principal (its client
    settings in admin.properties)."""
    commands = []
    for spec in specs:
        words = ["kafka-topics", "--bootstrap-server", bootstrap_servers,
                 "--command-config", "admin.properties", "--create", "--topic", spec.name,
                 "--partitions", str(spec.partitions),
                 "--replication-factor", str(spec.replication_factor)]
        for name, value in sorted(spec.configs.items()):
            words += ["--config", f"{name}={value}"]
        commands.append(shlex.join(words))
    return commands


# Strimzi's KafkaTopic API (kafka.strimzi.io/v1: Strimzi 0.49 and later). A topic's resource
# is named after it where the name is a valid Kubernetes name; otherwise the name is made one,
# with a hash of the topic's to keep two such names apart, and spec.topicName says the topic's.
STRIMZI_API_VERSION = "kafka.strimzi.io/v1"
_KUBERNETES_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def strimzi_resource_name(topic: str) -> str:
    """The KafkaTopic's metadata.name for `topic` (a DNS subdomain, as Kubernetes requires)."""
    if _KUBERNETES_NAME.fullmatch(topic):
        return topic
    stem = re.sub(r"[^a-z0-9.-]+", "-", topic.lower()).strip("-.")[:200]
    digest = hashlib.sha256(topic.encode("utf-8")).hexdigest()[:8]
    return f"{stem}-{digest}" if stem else f"topic-{digest}"


def strimzi_kafka_topics(specs: list[TopicSpec], cluster: str) -> str:
    """The topics as Strimzi KafkaTopic resources of cluster `cluster`, one YAML document
    each, with the partitions, replicas and configs `topics create` would create them with.
    Whole-number configs are YAML numbers, as Strimzi's examples write them."""
    documents = []
    for spec in specs:
        name = strimzi_resource_name(spec.name)
        lines = [
            f"apiVersion: {STRIMZI_API_VERSION}",
            "kind: KafkaTopic",
            "metadata:",
            f"  name: {_yaml(name)}",
            "  labels:",
            f"    strimzi.io/cluster: {_yaml(cluster)}",
            "    app.kubernetes.io/part-of: context-assembler",
            "spec:",
        ]
        if name != spec.name:
            lines.append(f"  topicName: {_yaml(spec.name)}")
        lines += [f"  partitions: {spec.partitions}", f"  replicas: {spec.replication_factor}",
                  "  config:"]
        for config, value in sorted(spec.configs.items()):
            number = value.isascii() and value.isdigit()
            lines.append(f"    {_yaml(config)}: {value if number else _yaml(value)}")
        documents.append("\n".join(lines))
    return "\n---\n".join(documents)


def _yaml(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escaping is valid YAML)."""
    return json.dumps(text)


@dataclass(frozen=True)
class TopicReport:
    name: str
    status: str  # "created", "exists", or "differs"
    differences: tuple[str, ...] = ()

    def render(self) -> str:
        line = f"{self.status:8} {self.name}"
        return line + (": " + "; ".join(self.differences) if self.differences else "")


async def create_topics(clients: KafkaClients, specs: list[TopicSpec]) -> list[TopicReport]:
    """Create what is missing; compare what exists with the spec. Raises TopicError when the
    broker cannot be reached or refuses a topic."""
    admin = clients.admin()
    try:
        await admin.start()
    except REFUSED_CONNECTION:
        raise await refused(clients) from None
    try:
        response = await admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, topic_configs=s.configs)
             for s in specs]
        )
        existing: list[TopicSpec] = []
        failures = []
        by_name = {s.name: s for s in specs}
        for error in response.to_object()["topic_errors"]:
            if answered(error, TopicAlreadyExistsError):
                existing.append(by_name[error["topic"]])
            elif not answered(error, NoError):
                problem = error["error_message"] or f"error {error['error_code']}"
                failures.append(f"{error['topic']}: {problem}")
        if failures:
            raise TopicError("could not create topics: " + "; ".join(failures))
        differences = await _differences(admin, existing)
    except KafkaError as error:
        raise TopicError(f"the broker at {clients.servers} refused: {error}") from None
    except TimeoutError:
        raise TopicError(f"the broker at {clients.servers} did not answer in time") from None
    finally:
        await admin.close()
    return [
        TopicReport(s.name, "created") if s not in existing
        else TopicReport(s.name, "differs" if differences[s.name] else "exists",
                         differences[s.name])
        for s in specs
    ]


async def _differences(
    admin: AIOKafkaAdminClient, specs: list[TopicSpec]
) -> dict[str, tuple[str, ...]]:
    """For each existing topic, how its partitions, replication and configs differ."""
    if not specs:
        return {}
    described = {t["topic"]: t for t in await admin.describe_topics([s.name for s in specs])}
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, s.name, configs=None) for s in specs]
    )
    configs: dict[str, dict[str, str | None]] = {}
    for response in responses:
        for resource in response.to_object()["resources"]:
            configs[resource["resource_name"]] = {
                entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
            }
    found: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        topic = described.get(spec.name, {})
        partitions = topic.get("partitions") or []
        problems = []
        if len(partitions) != spec.partitions:
            problems.append(f"partitions {len(partitions)} (wanted {spec.partitions})")
        replicas = min((len(p["replicas"]) for p in partitions), default=0)
        if partitions and replicas != spec.replication_factor:
            problems.append(f"replication factor {replicas} (wanted {spec.replication_factor})")
        actual = configs.get(spec.name, {})
        for name, wanted in spec.configs.items():
            if actual.get(name) != wanted:
                problems.append(f"{name} {actual.get(name)} (wanted {wanted})")
        found[spec.name] = tuple(problems)
    return found


class TopicWatch:
    """Which of the worker's topics are missing, checked every `interval` seconds, so /ready
    can say why the worker waits (faust only logs "Ignoring missing topic" at each rebalance).
    A change is logged once: each missing topic with the command that creates it. So is a
    broker refusing the connection once the worker runs (credentials rotated, a certificate
    expired), which aiokafka's clients only log at each reconnect."""

    def __init__(self, clients: KafkaClients, topics: list[str], interval: float = 5.0) -> None:
        self._clients = clients
        self.topics = topics
        self._interval = interval
        self.missing: tuple[str, ...] = ()
        self.checked = False  # whether the broker has described the topics once
        self.refused: str | None = None  # why the broker refuses the connection, if it does

    def reason(self) -> str | None:
        if self.refused:
            return f"the broker refuses the connection: {self.refused}"
        if not self.checked:  # not ready on a guess: a topic may be missing
            return "checking that the worker's topics exist"
        if not self.missing:
            return None
        return f"missing topics: {', '.join(self.missing)}; create them with `{CREATE_COMMAND}`"

    async def run(self) -> None:
        """Until cancelled. A broker that does not answer leaves the last finding as it is:
        the consumer reports that on its own."""
        admin = self._clients.admin()
        try:
            while True:
                try:
                    await admin.start()  # no-op once started
                    described = await admin.describe_topics(self.topics)
                except (*REFUSED_CONNECTION, NodeNotReadyError):
                    self._refused(await connection_problem(self._clients.servers,
                                                           self._clients.security))
                except (KafkaError, TimeoutError):
                    pass
                else:
                    self._refused(None)
                    self._update(described)
                    self.checked = True
                await asyncio.sleep(self._interval)
        finally:
            await admin.close()

    def _refused(self, problem: str | None) -> None:
        if problem and problem != self.refused:
            log.error("the broker refuses the connection: %s", problem)
        elif self.refused and not problem:
            log.info("the broker accepts the connection again")
        self.refused = problem

    def _update(self, described: list[dict[str, Any]]) -> None:
        unknown = {t["topic"] for t in described if answered(t, UnknownTopicOrPartitionError)}
        missing = tuple(t for t in self.topics if t in unknown)  # the broker's order varies
        for topic in sorted(set(missing) - set(self.missing)):
            log.error("topic %s does not exist; create it with `%s`", topic, CREATE_COMMAND,
                      extra={"topic": topic})
        if self.missing and not missing:
            log.info("every topic exists now", extra={"topics": self.topics})
        self.missing = missing


def topic_watch(settings: Settings) -> TopicWatch:
    """A watch on the topics worker_topics creates."""
    return TopicWatch(KafkaClients.of(settings), [s.name for s in worker_topics(settings, 1, 1)])
