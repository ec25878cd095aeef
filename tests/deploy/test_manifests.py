"""Static checks of the deployment files against the worker's contract.

Covers deploy/Dockerfile, docker-compose.yml and deploy/k8s/*.yaml. Nothing here
needs Docker, Kafka or a cluster: the files are parsed and cross-checked, the
Kubernetes objects (except the KEDA custom resource) are validated against the
upstream JSON schemas shipped by ``kubernetes-validate``, and the Dockerfile's
HEALTHCHECK command is run against a throwaway HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import posixpath
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
COMPOSE_FILE = REPO / "docker-compose.yml"
K8S_DIR = REPO / "deploy" / "k8s"

#: Every setting the worker reads from the environment (prefix ``ASSEMBLER_``).
#: Another test compares this set with the real settings object.
KNOWN_SETTINGS: frozenset[str] = frozenset(
    {
        "ASSEMBLER_BOOTSTRAP_SERVERS",
        "ASSEMBLER_INPUT_TOPIC",
        "ASSEMBLER_PROMPTS_TOPIC",
        "ASSEMBLER_AUDIT_TOPIC",
        "ASSEMBLER_DLQ_TOPIC",
        "ASSEMBLER_GROUP_ID",
        "ASSEMBLER_POLICY_FILE",
        "ASSEMBLER_PROCESSING_GUARANTEE",
        "ASSEMBLER_HTTP_PORT",
    }
)
SETTINGS_PREFIX = "ASSEMBLER_"
#: The four topics the worker reads from or writes to.
TOPIC_SETTINGS: tuple[str, ...] = (
    "ASSEMBLER_INPUT_TOPIC",
    "ASSEMBLER_PROMPTS_TOPIC",
    "ASSEMBLER_AUDIT_TOPIC",
    "ASSEMBLER_DLQ_TOPIC",
)
#: Settings a deployment must set explicitly (the rest have usable defaults).
REQUIRED_IN_DEPLOYMENTS: frozenset[str] = frozenset(
    {
        "ASSEMBLER_BOOTSTRAP_SERVERS",
        *TOPIC_SETTINGS,
        "ASSEMBLER_GROUP_ID",
        "ASSEMBLER_POLICY_FILE",
        "ASSEMBLER_HTTP_PORT",
    }
)
PROCESSING_GUARANTEES: frozenset[str] = frozenset({"at_least_once", "exactly_once"})
CONSOLE_SCRIPT = "context-assembler"
APP_LABEL = ("app.kubernetes.io/name", "context-assembler")
#: The partition-count annotation on the KEDA ScaledObject (the k8s-side record
#: of how many partitions maxReplicaCount was sized for).
PARTITIONS_ANNOTATION = "context-assembler/input-partitions"
#: Kubernetes versions whose schemas the built-in objects must satisfy.
K8S_SCHEMA_VERSIONS: tuple[str, ...] = ("1.30", "1.33")


# --------------------------------------------------------------------------- helpers


def _as_dict(value: object, where: str) -> dict[str, Any]:
    assert isinstance(value, dict), f"{where}: expected a mapping, got {type(value).__name__}"
    return value


def _as_list(value: object, where: str) -> list[Any]:
    assert isinstance(value, list), f"{where}: expected a list, got {type(value).__name__}"
    return value


def _as_str(value: object, where: str) -> str:
    assert isinstance(value, str), f"{where}: expected a string, got {type(value).__name__}"
    return value


def _load_single_yaml(path: Path) -> dict[str, Any]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    assert len(docs) == 1, f"{path.name}: expected exactly one YAML document, found {len(docs)}"
    return _as_dict(docs[0], path.name)


_COMPOSE_VAR = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?-)(?P<default>[^}]*))?\}"
)


def _compose_default(value: object) -> str:
    """Interpolate a compose value the way `docker compose` does with no variables set."""
    text = str(value)

    def substitute(match: re.Match[str]) -> str:
        default = match.group("default")
        assert default is not None, f"{match.group(0)} has no default: compose would need it set"
        return default

    return _COMPOSE_VAR.sub(substitute, text.replace("$$", "\0")).replace("\0", "$")


def _compose_env(service: dict[str, Any], where: str) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        pairs = (str(item).split("=", 1) for item in raw)
        return {pair[0]: _compose_default(pair[1] if len(pair) == 2 else "") for pair in pairs}
    return {str(k): _compose_default(v) for k, v in _as_dict(raw, where).items()}


def _k8s_env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in _as_list(container.get("env", []), "container env"):
        entry = _as_dict(item, "container env entry")
        name = _as_str(entry["name"], "env name")
        assert name not in env, f"env var {name} is set twice"
        assert "value" in entry, f"{name}: expected a literal value"
        env[name] = _as_str(entry["value"], f"env {name} (quote numbers in YAML)")
    return env


@dataclass
class Stage:
    """One FROM ... stage of a Dockerfile: its base image and its instructions."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def _dockerfile_lines(text: str) -> Iterator[tuple[str, str]]:
    """Yield (INSTRUCTION, arguments) with continuations joined and comments dropped."""
    buffer = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        logical = (buffer + stripped).strip()
        buffer = ""
        keyword, _, rest = logical.partition(" ")
        yield keyword.upper(), rest.strip()
    assert not buffer, "Dockerfile ends inside a line continuation"


def _parse_dockerfile(text: str) -> list[Stage]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in _dockerfile_lines(text):
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--platform")]
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=image, name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, found {keyword}"
            arg_name, _, default = rest.partition("=")
            global_args[arg_name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return stages


def _dockerfile_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in stage.args("ENV"):
        words = shlex.split(rest)
        if words and "=" not in words[0]:  # legacy form: ENV KEY value
            env[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, _, value = word.partition("=")
            env[key] = value
    return env


def _exec_form(rest: str, where: str) -> list[str]:
    assert rest.startswith("["), f"{where} must use the exec (JSON array) form: {rest}"
    parsed = _as_list(json.loads(rest), where)
    return [_as_str(item, where) for item in parsed]


def _resolve_port(port: object, container: dict[str, Any]) -> int:
    if isinstance(port, int):
        return port
    for item in _as_list(container.get("ports", []), "container ports"):
        entry = _as_dict(item, "container port")
        if entry.get("name") == port:
            return int(entry["containerPort"])
    raise AssertionError(f"probe port {port!r} names no container port")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_single_yaml(COMPOSE_FILE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = _as_dict(compose.get("services"), "compose services")
    return {name: _as_dict(svc, f"service {name}") for name, svc in raw.items()}


@pytest.fixture(scope="module")
def partitions() -> int:
    """The partition count: the default of ``${PARTITIONS:-N}`` in docker-compose.yml."""
    defaults = {
        m.group("default")
        for m in _COMPOSE_VAR.finditer(COMPOSE_FILE.read_text(encoding="utf-8"))
        if m.group("name") == "PARTITIONS"
    }
    assert len(defaults) == 1, f"expected one default for ${{PARTITIONS}}, found {defaults}"
    (default,) = defaults
    assert default is not None and default.isdigit(), f"PARTITIONS default {default!r}"
    count = int(default)
    assert count >= 1
    return count


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    """The Kubernetes objects of deploy/k8s, by kind (each kind occurs once)."""
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        doc = _load_single_yaml(path)
        kind = _as_str(doc.get("kind"), f"{path.name} kind")
        _as_str(doc.get("apiVersion"), f"{path.name} apiVersion")
        _as_str(_as_dict(doc.get("metadata"), f"{path.name} metadata").get("name"), path.name)
        assert kind not in objects, f"two objects of kind {kind}"
        objects[kind] = doc
    return objects


@pytest.fixture(scope="module")
def deployment(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return k8s["Deployment"]


@pytest.fixture(scope="module")
def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    return _as_dict(deployment["spec"]["template"]["spec"], "pod spec")


@pytest.fixture(scope="module")
def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    containers = _as_list(pod_spec["containers"], "containers")
    assert len(containers) == 1, "the worker pod has exactly one container"
    return _as_dict(containers[0], "container")


@pytest.fixture(scope="module")
def k8s_env(container: dict[str, Any]) -> dict[str, str]:
    return _k8s_env(container)


@pytest.fixture(scope="module")
def worker_env(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    return _compose_env(services["worker"], "worker environment")


@pytest.fixture(scope="module")
def http_port(k8s_env: dict[str, str]) -> int:
    return int(k8s_env["ASSEMBLER_HTTP_PORT"])


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return _parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def final_stage(stages: list[Stage]) -> Stage:
    return stages[-1]


# --------------------------------------------------------------------------- Kubernetes


def test_kustomization_lists_every_manifest(k8s: dict[str, dict[str, Any]]) -> None:
    kustomization = _load_single_yaml(K8S_DIR / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    resources = [_as_str(r, "resource") for r in _as_list(kustomization["resources"], "res")]
    on_disk = {p.name for p in K8S_DIR.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(resources) == sorted(on_disk)
    assert set(k8s) == {"ConfigMap", "Deployment", "PodDisruptionBudget", "ScaledObject", "Job"}


def test_builtin_objects_match_kubernetes_schemas(k8s: dict[str, dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for kind in ("Deployment", "ConfigMap", "PodDisruptionBudget", "Job"):
        for version in K8S_SCHEMA_VERSIONS:
            # strict: unknown fields (typos such as `readinesProbe`) are errors too.
            kv.validate(k8s[kind], version, strict=True)


def test_schema_validation_is_not_vacuous(deployment: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_SCHEMA_VERSIONS[0], strict=True)
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_SCHEMA_VERSIONS[0], strict=True)


def test_probes_hit_health_and_ready_on_the_http_port(
    container: dict[str, Any], k8s_env: dict[str, str], http_port: int
) -> None:
    liveness = _as_dict(container.get("livenessProbe"), "livenessProbe")["httpGet"]
    readiness = _as_dict(container.get("readinessProbe"), "readinessProbe")["httpGet"]
    assert liveness["path"] == "/health"
    assert readiness["path"] == "/ready"
    assert _resolve_port(liveness["port"], container) == http_port
    assert _resolve_port(readiness["port"], container) == http_port
    if "startupProbe" in container:
        startup = container["startupProbe"]["httpGet"]
        assert startup["path"] == "/health"
        assert _resolve_port(startup["port"], container) == http_port
    declared = {int(p["containerPort"]) for p in _as_list(container["ports"], "ports")}
    assert http_port in declared


def test_prometheus_scrape_annotations_point_at_metrics(
    deployment: dict[str, Any], http_port: int
) -> None:
    annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("prometheus.io/scrape") == "true":
        assert annotations["prometheus.io/port"] == str(http_port)
        assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"


def test_policy_configmap_is_mounted_at_policy_file(
    k8s: dict[str, dict[str, Any]],
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    k8s_env: dict[str, str],
) -> None:
    policy_file = k8s_env["ASSEMBLER_POLICY_FILE"]
    assert posixpath.isabs(policy_file)
    configmap = k8s["ConfigMap"]
    volumes = {v["name"]: _as_dict(v, "volume") for v in _as_list(pod_spec["volumes"], "volumes")}

    key: str | None = None
    for mount in _as_list(container["volumeMounts"], "volumeMounts"):
        volume = volumes[mount["name"]]
        if "configMap" not in volume:
            continue
        source = volume["configMap"]
        assert source["name"] == configmap["metadata"]["name"], "volume names another ConfigMap"
        items = {i["path"]: i["key"] for i in source.get("items", [])}
        mount_path = posixpath.normpath(mount["mountPath"])
        if "subPath" in mount:
            if mount_path == policy_file:
                key = items.get(mount["subPath"], mount["subPath"])
        elif posixpath.dirname(policy_file) == mount_path:
            name = posixpath.basename(policy_file)
            key = items.get(name, None if items else name)
        if key is not None:
            assert mount.get("readOnly") is True, "mount the policy read-only"
            break
    assert key is not None, f"no ConfigMap volume provides {policy_file}"

    content = _as_str(configmap["data"].get(key), f"ConfigMap key {key}")
    policy = tomllib.loads(content)
    assert policy, "the policy TOML is empty"


def test_keda_never_scales_past_the_partition_count(
    k8s: dict[str, dict[str, Any]], deployment: dict[str, Any], partitions: int
) -> None:
    scaled = k8s["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    documented = int(scaled["metadata"]["annotations"][PARTITIONS_ANNOTATION])
    assert documented == partitions, "k8s partition count disagrees with docker-compose.yml"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions
    assert spec["maxReplicaCount"] <= documented
    # A fixed replica count on the Deployment would fight KEDA's HPA.
    assert deployment["spec"].get("replicas", 1) <= spec["maxReplicaCount"]
    target = spec["scaleTargetRef"]
    assert target.get("kind", "Deployment") == "Deployment"
    assert target["name"] == deployment["metadata"]["name"]


def test_keda_trigger_watches_the_workers_group_and_topic(
    k8s: dict[str, dict[str, Any]], k8s_env: dict[str, str]
) -> None:
    triggers = _as_list(k8s["ScaledObject"]["spec"]["triggers"], "triggers")
    assert len(triggers) == 1
    trigger = triggers[0]
    assert trigger["type"] == "kafka"
    metadata = _as_dict(trigger["metadata"], "trigger metadata")
    for name, value in metadata.items():
        # KEDA's CRD types trigger metadata as map[string]string.
        assert isinstance(value, str), f"trigger metadata {name} must be a quoted string"
    assert metadata["consumerGroup"] == k8s_env["ASSEMBLER_GROUP_ID"]
    assert metadata["topic"] == k8s_env["ASSEMBLER_INPUT_TOPIC"]
    assert metadata["bootstrapServers"] == k8s_env["ASSEMBLER_BOOTSTRAP_SERVERS"]
    assert int(metadata["lagThreshold"]) > 0
    assert metadata.get("allowIdleConsumers", "false") == "false"


def test_selectors_match_pod_labels(
    k8s: dict[str, dict[str, Any]], deployment: dict[str, Any]
) -> None:
    pod_labels = _as_dict(deployment["spec"]["template"]["metadata"]["labels"], "pod labels")
    assert pod_labels.get(APP_LABEL[0]) == APP_LABEL[1]
    for kind, selector in (
        ("Deployment", deployment["spec"]["selector"]),
        ("PodDisruptionBudget", k8s["PodDisruptionBudget"]["spec"]["selector"]),
    ):
        assert "matchExpressions" not in selector, f"{kind}: keep selectors to matchLabels"
        match = _as_dict(selector["matchLabels"], f"{kind} matchLabels")
        assert match, f"{kind}: empty selector"
        assert match.items() <= pod_labels.items(), f"{kind} selector misses the pods"
    pdb = k8s["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1


def test_rollout_does_not_surge_past_the_partition_count(deployment: dict[str, Any]) -> None:
    # At maxReplicaCount == partitions a surge pod gets no partition, never
    # passes /ready, and the rollout stalls.
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxSurge"] == 0
    assert strategy["rollingUpdate"]["maxUnavailable"] >= 1


def test_pod_runs_as_the_images_non_root_user(
    pod_spec: dict[str, Any], container: dict[str, Any], final_stage: Stage
) -> None:
    pod_security = pod_spec.get("securityContext", {})
    security = {**pod_security, **container.get("securityContext", {})}
    assert security.get("runAsNonRoot") is True
    assert security.get("allowPrivilegeEscalation") is False
    user = final_stage.args("USER")[-1]
    uid, _, gid = user.partition(":")
    assert security.get("runAsUser") == int(uid)
    if gid:
        assert security.get("runAsGroup") == int(gid)
    assert 25 <= pod_spec.get("terminationGracePeriodSeconds", 30) <= 60
    resources = container["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(resources[section]), f"resources.{section}"
    if security.get("readOnlyRootFilesystem"):
        # Everything the worker writes must land on a volume.
        mounted = {posixpath.normpath(m["mountPath"]) for m in container["volumeMounts"]}
        workdir = final_stage.args("WORKDIR")[-1]
        assert {"/tmp", posixpath.normpath(workdir)} <= mounted


def test_container_keeps_the_image_entrypoint(
    container: dict[str, Any], final_stage: Stage
) -> None:
    assert "command" not in container, "`command` would replace the context-assembler entrypoint"
    cmd = _exec_form(final_stage.args("CMD")[-1], "CMD")
    assert container.get("args", cmd) == cmd


# --------------------------------------------------------------------------- settings


def test_env_names_are_known_settings(
    worker_env: dict[str, str], k8s_env: dict[str, str], final_stage: Stage
) -> None:
    for where, env in (("compose worker", worker_env), ("k8s Deployment", k8s_env)):
        for name in env:
            assert name.startswith(SETTINGS_PREFIX), f"{where}: {name} lacks the prefix"
            assert name in KNOWN_SETTINGS, f"{where}: {name} is not a worker setting"
        missing = REQUIRED_IN_DEPLOYMENTS - set(env)
        assert not missing, f"{where} does not set {sorted(missing)}"
        guarantee = env.get("ASSEMBLER_PROCESSING_GUARANTEE", "at_least_once")
        assert guarantee in PROCESSING_GUARANTEES, f"{where}: {guarantee}"
        assert 0 < int(env["ASSEMBLER_HTTP_PORT"]) < 65536
    for name in _dockerfile_env(final_stage):
        if name.startswith(SETTINGS_PREFIX):
            assert name in KNOWN_SETTINGS, f"Dockerfile: {name} is not a worker setting"


def test_compose_and_k8s_agree_on_topics_and_group(
    worker_env: dict[str, str], k8s_env: dict[str, str]
) -> None:
    for name in (*TOPIC_SETTINGS, "ASSEMBLER_GROUP_ID", "ASSEMBLER_POLICY_FILE"):
        assert worker_env[name] == k8s_env[name], name
    topics = [worker_env[name] for name in TOPIC_SETTINGS]
    assert len(set(topics)) == len(topics), "two settings name the same topic"


# --------------------------------------------------------------------------- compose


def test_compose_worker_is_scalable(services: dict[str, dict[str, Any]]) -> None:
    worker = services["worker"]
    assert "container_name" not in worker, "container_name prevents --scale"
    assert "ports" not in worker, "a fixed host port prevents --scale"
    assert "hostname" not in worker
    build = _as_dict(worker["build"], "worker build")
    context = REPO / build.get("context", ".")
    assert context.resolve() == REPO
    assert (context / build["dockerfile"]).resolve() == DOCKERFILE.resolve()
    assert worker["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "topics": {"condition": "service_completed_successfully"},
    }
    assert "healthcheck" in services["kafka"], "service_healthy needs a kafka healthcheck"
    assert services["kafka"]["healthcheck"].get("disable") is not True


def test_compose_mounts_the_policy_file(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    mounts: dict[str, dict[str, Any]] = {}
    for item in _as_list(services["worker"]["volumes"], "worker volumes"):
        if isinstance(item, str):
            source, target, *opts = item.split(":")
            mounts[target] = {"source": source, "read_only": "ro" in opts}
        else:
            mounts[item["target"]] = _as_dict(item, "volume")
    mount = mounts[worker_env["ASSEMBLER_POLICY_FILE"]]
    assert mount.get("read_only") is True
    source = REPO / mount["source"]
    assert source == REPO / "examples" / "policy.toml"
    # A missing bind source would be created as an empty directory (short syntax)
    # or refused (long syntax): either way the worker would not start.
    assert source.is_file(), f"{source} is missing"
    assert tomllib.loads(source.read_text(encoding="utf-8"))


def test_compose_kafka_is_single_node_kraft(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    kafka = services["kafka"]
    assert kafka["image"] == "apache/kafka:4.0.0"
    env = _compose_env(kafka, "kafka environment")
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["CLUSTER_ID"], "KRaft mode needs a CLUSTER_ID"
    node_id = env["KAFKA_NODE_ID"]
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    listeners = {
        name: address
        for name, _, address in (e.partition("://") for e in env["KAFKA_LISTENERS"].split(","))
    }
    voter_id, _, voter_address = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert voter_id == node_id
    assert voter_address.rsplit(":", 1)[1] == listeners[controller].rsplit(":", 1)[1]
    # One broker: any replication factor or min ISR above 1 breaks groups/transactions.
    for name in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[name] == "1", name
    for name, value in env.items():
        if name.endswith(("_REPLICATION_FACTOR", "_MIN_ISR", "MIN_INSYNC_REPLICAS")):
            assert value == "1", name
    advertised = {
        entry.split("://", 1)[1] for entry in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    }
    assert worker_env["ASSEMBLER_BOOTSTRAP_SERVERS"] in advertised


def _topics_create(args: list[str]) -> argparse.Namespace:
    """The arguments of a `context-assembler topics create` as the CLI parses them."""
    from worker.cli.main import build_parser

    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.topics_command) == ("topics", "create"), args
    return parsed


def test_compose_topics_runs_topics_create_with_the_workers_settings(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str], partitions: int
) -> None:
    topics_service = services["topics"]
    assert topics_service["image"] == services["worker"]["image"]
    assert topics_service["build"] == services["worker"]["build"]
    assert topics_service["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    command = [str(word) for word in _as_list(topics_service["command"], "topics command")]
    assert "${PARTITIONS:-" in " ".join(command), "partitions must follow ${PARTITIONS}"
    parsed = _topics_create([_compose_default(word) for word in command])
    assert parsed.partitions == partitions
    assert parsed.replication_factor == 1
    env = _compose_env(topics_service, "topics environment")
    for name in ("ASSEMBLER_BOOTSTRAP_SERVERS", *TOPIC_SETTINGS):
        assert env[name] == worker_env[name], name


def test_k8s_topics_job_runs_topics_create_with_the_workers_settings(
    k8s: dict[str, dict[str, Any]], k8s_env: dict[str, str], container: dict[str, Any]
) -> None:
    job = k8s["Job"]
    pod = _as_dict(job["spec"]["template"]["spec"], "job pod spec")
    (job_container,) = _as_list(pod["containers"], "job containers")
    assert job_container["image"] == container["image"]
    parsed = _topics_create([_as_str(a, "job args") for a in job_container["args"]])
    annotations = k8s["ScaledObject"]["metadata"]["annotations"]
    assert parsed.partitions == int(annotations[PARTITIONS_ANNOTATION])
    env = _k8s_env(job_container)
    for name in ("ASSEMBLER_BOOTSTRAP_SERVERS", *TOPIC_SETTINGS):
        assert env[name] == k8s_env[name], name
    # The worker's selectors must not count the Job's pods as workers.
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels[APP_LABEL[0]] != APP_LABEL[1]


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_builds_a_non_root_worker_image(
    stages: list[Stage], final_stage: Stage, http_port: int
) -> None:
    assert len(stages) >= 2, "multi-stage build expected"
    for stage in stages:
        assert stage.base == "python:3.11-slim", stage.base
    runs = " ".join(rest for stage in stages for rest in stage.args("RUN"))
    assert re.search(r"pip install (\S+ )*\.(\s|$)", runs), "the project is installed with pip"

    users = final_stage.args("USER")
    assert users, "the runtime stage must switch to a non-root USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "use a numeric non-root uid (runAsNonRoot needs it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)

    assert _exec_form(final_stage.args("ENTRYPOINT")[-1], "ENTRYPOINT") == [CONSOLE_SCRIPT]
    assert _exec_form(final_stage.args("CMD")[-1], "CMD") == ["worker"]
    exposed = {p.split("/")[0] for rest in final_stage.args("EXPOSE") for p in rest.split()}
    assert str(http_port) in exposed
    env = _dockerfile_env(final_stage)
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("ASSEMBLER_HTTP_PORT", "8080") == str(http_port)

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert CONSOLE_SCRIPT in pyproject["project"]["scripts"], "ENTRYPOINT names no console script"


def test_dockerfile_copies_only_existing_paths(stages: list[Stage]) -> None:
    for stage in stages:
        for rest in stage.args("COPY"):
            words = rest.split()
            if any(w.startswith("--from") for w in words):
                continue
            sources = [w for w in words[:-1] if not w.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"COPY {source}: not in the build context"


def _healthcheck_argv(stage: Stage) -> list[str]:
    checks = stage.args("HEALTHCHECK")
    assert checks, "the runtime stage needs a HEALTHCHECK"
    _, sep, command = checks[-1].partition("CMD ")
    assert sep, "HEALTHCHECK must use CMD"
    argv = _exec_form(command.strip(), "HEALTHCHECK CMD")
    assert argv[0] == "python", "slim has no curl: the healthcheck runs python"
    return [sys.executable, *argv[1:]]


@contextmanager
def _http_server(status: int) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_dockerfile_healthcheck_probes_health(
    final_stage: Stage, status: int, healthy: bool
) -> None:
    argv = _healthcheck_argv(final_stage)
    assert "/health" in " ".join(argv)
    with _http_server(status) as port:
        env = {**os.environ, "ASSEMBLER_HTTP_PORT": str(port)}
        result = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
    assert (result.returncode == 0) is healthy, result.stderr.decode(errors="replace")
