"""Static checks of the deployment files against the worker's contract.

Covers docker-compose.yml, .env and deploy/k8s (kustomize: base/ is the at_least_once
Deployment, overlays/exactly-once the StatefulSet). Nothing here needs Docker, Kafka or a
cluster: the kustomizations are rendered (tests/deploy/kustomize.py, checked against
`kubectl kustomize` where kubectl is installed), the built-in objects are validated against
the upstream Kubernetes schemas (`kubernetes-validate`), the ScaledObject against KEDA's CRD
and docker-compose.yml against the compose specification (both vendored in schemas/), and
everything is cross-checked with the worker's own settings, CLI and policy loader.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import re
import shutil
import socket
import subprocess
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from context_assembler.intake.policy_registry import load_policy
from context_assembler.kafka.tools.topics import worker_topics
from context_assembler.observability.tracing import ENDPOINT_VARIABLE
from context_assembler.settings import Settings
from harness.budgets import WORKER_RSS_LIMIT_MB
from tests.deploy import kustomize
from tests.deploy.kubeconform import KUBERNETES_VERSIONS, strict_schema
from tests.deploy.kustomize import Object

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOTENV = REPO / ".env"
K8S = REPO / "deploy" / "k8s"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
#: Each kustomize entry point, the workload it runs and that workload's guarantee.
ENTRY_POINTS: dict[str, tuple[Path, str, str]] = {
    "base": (K8S / "base", "Deployment", "at_least_once"),
    "exactly-once": (K8S / "overlays" / "exactly-once", "StatefulSet", "exactly_once"),
}
GENERATED = {"context-assembler-policy", "context-assembler-settings"}

SETTINGS_PREFIX: str = Settings.model_config["env_prefix"]
#: Every setting the worker reads from the environment, as the settings object declares them.
KNOWN_SETTINGS: frozenset[str] = frozenset(
    f"{SETTINGS_PREFIX}{name.upper()}" for name in Settings.model_fields
)
#: Variables the worker reads that are not its settings: the standard OpenTelemetry switch.
OTHER_VARIABLES: frozenset[str] = frozenset({ENDPOINT_VARIABLE})
TOPIC_SETTINGS: tuple[str, ...] = tuple(
    f"{SETTINGS_PREFIX}{name.upper()}" for name in Settings.model_fields if name.endswith("_topic")
)
#: Settings a deployment must set explicitly (the rest have usable defaults).
REQUIRED_IN_DEPLOYMENTS: frozenset[str] = frozenset(
    f"{SETTINGS_PREFIX}{name}"
    for name in ("BOOTSTRAP_SERVERS", "GROUP_ID", "POLICY_FILE", "HTTP_HOST", "HTTP_PORT")
)
PROCESSING_GUARANTEES: frozenset[str] = frozenset(
    typing.get_args(Settings.model_fields["processing_guarantee"].annotation)
)
APP_LABEL = ("app.kubernetes.io/name", "context-assembler")
#: The partition-count annotation on the KEDA ScaledObject (the k8s-side record
#: of how many partitions maxReplicaCount was sized for).
PARTITIONS_ANNOTATION = "context-assembler/input-partitions"
#: Issue 13's measurement: one replica keeping up at 200 events/s showed a committed lag of at
#: most 217 (offsets are committed after delivery); at the ~400 events/s one worker sustains,
#: twice that. A lagThreshold at or below it would add replicas to a group that keeps up.
COMMITTED_LAG_AT_CAPACITY = 2 * 217
#: Trigger metadata KEDA v2.20's kafka scaler reads (pkg/scalers/kafka_scaler.go), with
#: `<name>FromEnv` for those it can read from the target's container; others are unknown.
KEDA_KAFKA_KEYS = frozenset(
    {"bootstrapServers", "consumerGroup", "topic", "partitionLimitation", "lagThreshold",
     "activationLagThreshold", "offsetResetPolicy", "allowIdleConsumers", "excludePersistentLag",
     "scaleToZeroOnInvalidOffset", "limitToPartitionsWithLag",
     "ensureEvenDistributionOfPartitions", "version", "tls", "sasl", "saslTokenProvider",
     "unsafeSsl", "awsRegion"}
)
KEDA_KINDS = frozenset({"ScaledObject", "TriggerAuthentication"})  # KEDA's, not built in
KEDA_KAFKA_FROM_ENV = frozenset({"bootstrapServers", "consumerGroup", "topic"})
KEDA_KAFKA_BOOLEANS = frozenset(
    {"allowIdleConsumers", "excludePersistentLag", "scaleToZeroOnInvalidOffset",
     "limitToPartitionsWithLag", "ensureEvenDistributionOfPartitions", "unsafeSsl"}
)


# --------------------------------------------------------------------------- helpers


def _dotenv() -> dict[str, str]:
    return kustomize.parse_env_file(DOTENV)


_COMPOSE_VAR = re.compile(
    r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<default>[^}]*))?\}"
)


def _interpolate(value: object) -> str:
    """A compose value as `docker compose` reads it with only .env set."""
    dotenv = _dotenv()

    def substitute(match: re.Match[str]) -> str:
        name, op, default = match.group("name", "op", "default")
        if name in dotenv:
            return dotenv[name]
        assert op is not None and op.endswith("-"), f"{match.group(0)}: compose would need it set"
        return str(default)

    return _COMPOSE_VAR.sub(substitute, str(value).replace("$$", "\0")).replace("\0", "$")


def _interpolated(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _interpolated(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_interpolated(item) for item in node]
    return _interpolate(node) if isinstance(node, str) else node


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment", {})
    if isinstance(raw, list):
        pairs = (str(item).split("=", 1) for item in raw)
        return {pair[0]: _interpolate(pair[1] if len(pair) == 2 else "") for pair in pairs}
    return {str(k): _interpolate(v) for k, v in raw.items()}


def _by_kind(objects: list[Object]) -> dict[str, Object]:
    kinds = [obj["kind"] for obj in objects if obj["kind"] != "ConfigMap"]
    assert len(kinds) == len(set(kinds)), f"one object of each kind expected: {kinds}"
    return {obj["kind"]: obj for obj in objects if obj["kind"] != "ConfigMap"}


def _configmap(objects: list[Object], name: str) -> dict[str, str]:
    (found,) = (o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name)
    data: dict[str, str] = found["data"]
    return data


def _container_env(objects: list[Object], container: Object) -> dict[str, str]:
    """What the container's process sees: envFrom ConfigMaps, then env (which wins)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(_configmap(objects, source["configMapRef"]["name"]))
    literal: dict[str, str] = {}
    for entry in container.get("env", []):
        assert entry["name"] not in literal, f"{entry['name']} is set twice"
        if "valueFrom" in entry:  # the downward API: the pod's own name, say
            literal[entry["name"]] = "$({})".format(entry["valueFrom"]["fieldRef"]["fieldPath"])
            continue
        assert isinstance(entry.get("value"), str), f"{entry['name']}: a quoted literal value"
        literal[entry["name"]] = entry["value"]
    return {**env, **literal}


def _resolve_port(port: object, container: Object) -> int:
    if isinstance(port, int):
        return port
    for entry in container.get("ports", []):
        if entry.get("name") == port:
            return int(entry["containerPort"])
    raise AssertionError(f"probe port {port!r} names no container port")


def _topics_create(args: list[str]) -> argparse.Namespace:
    """The arguments of a `context-assembler topics create` as the CLI parses them."""
    from context_assembler.cli.main import build_parser

    parsed = build_parser().parse_args(args)
    assert (parsed.command, parsed.topics_command) == ("topics", "create"), args
    return parsed


def _memory_mib(quantity: str) -> float:
    units = {"Ki": 2**-10, "Mi": 1, "Gi": 2**10, "M": 10**6 / 2**20, "G": 10**9 / 2**20}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", quantity)
    assert match is not None, f"memory quantity {quantity!r}"
    return float(match.group(1)) * units[match.group(2)]


def _keda_validator() -> jsonschema.Draft7Validator:
    (crd,) = kustomize.load_yaml(SCHEMAS / "keda.sh_scaledobjects.yaml")
    (version,) = (v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return jsonschema.Draft7Validator(strict_schema(version["schema"]["openAPIV3Schema"]))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = kustomize.load_yaml(COMPOSE_FILE)
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


@pytest.fixture(scope="module")
def worker_env(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    return _compose_env(services["worker"])


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
    return int(default)


@pytest.fixture(scope="module", params=sorted(ENTRY_POINTS))
def entry(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def objects(entry: str) -> list[Object]:
    return kustomize.render(ENTRY_POINTS[entry][0])


@pytest.fixture(scope="module")
def k8s(objects: list[Object]) -> dict[str, Object]:
    return _by_kind(objects)


@pytest.fixture(scope="module")
def workload(entry: str, k8s: dict[str, Object]) -> Object:
    return k8s[ENTRY_POINTS[entry][1]]


@pytest.fixture(scope="module")
def pod_spec(workload: Object) -> Object:
    spec: Object = workload["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def container(pod_spec: Object) -> Object:
    (only,) = pod_spec["containers"]
    return dict(only)


@pytest.fixture(scope="module")
def k8s_env(objects: list[Object], container: Object) -> dict[str, str]:
    return _container_env(objects, container)


@pytest.fixture(scope="module")
def http_port(k8s_env: dict[str, str]) -> int:
    return int(k8s_env["ASSEMBLER_HTTP_PORT"])


@pytest.fixture(scope="module")
def image_user() -> tuple[int, int]:
    """The runtime stage's numeric USER uid:gid (deploy/Dockerfile)."""
    users = re.findall(r"^USER\s+(\d+):(\d+)\s*$", (REPO / "deploy" / "Dockerfile").read_text(),
                       flags=re.MULTILINE)
    uid, gid = users[-1]
    return int(uid), int(gid)


# --------------------------------------------------------------------------- kustomize


def test_every_file_under_deploy_k8s_is_used() -> None:
    used: set[Path] = set()
    components = [path.parent for path in (K8S / "components").glob("*/kustomization.yaml")]
    for directory in [*(path for path, _, _ in ENTRY_POINTS.values()), *components]:
        doc = kustomize.kustomization(directory)
        used.add(directory / "kustomization.yaml")
        for entry in doc.get("resources", []):
            used.add((directory / entry).resolve() if (directory / entry).is_file()
                     else directory / entry / "kustomization.yaml")
        for generator in doc.get("configMapGenerator", []):
            used.update(directory / f for f in [*generator.get("files", []),
                                                *generator.get("envs", [])])
    on_disk = {path for path in K8S.rglob("*") if path.is_file()}
    assert on_disk == {path.resolve() for path in used}


def test_both_entry_points_render_and_the_overlay_swaps_only_the_workload() -> None:
    base = kustomize.render(ENTRY_POINTS["base"][0])
    overlay = kustomize.render(ENTRY_POINTS["exactly-once"][0])
    base_ids = {kustomize.identity(obj) for obj in base}
    overlay_ids = {kustomize.identity(obj) for obj in overlay}
    assert base_ids - overlay_ids == {("Deployment", "context-assembler")}
    assert overlay_ids - base_ids == {("StatefulSet", "context-assembler"),
                                      ("Service", "context-assembler")}
    for obj in base:
        if obj["kind"] not in {"Deployment", "ScaledObject"}:
            assert obj in overlay, f"the overlay changed {kustomize.identity(obj)}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_render_is_what_kubectl_kustomize_makes(entry: str, objects: list[Object]) -> None:
    result = subprocess.run(["kubectl", "kustomize", str(ENTRY_POINTS[entry][0])],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    # kustomize appends a hash of the content to each generated ConfigMap's name, everywhere
    # the name is referenced: that is what turns a policy or settings edit into a rollout.
    for obj in rendered:
        if obj["kind"] == "ConfigMap":
            assert re.fullmatch(r"context-assembler-(policy|settings)-[a-z0-9]{10}",
                                obj["metadata"]["name"])
    key = lambda obj: kustomize.identity(obj)  # noqa: E731
    assert sorted(kustomize.normalise(rendered, GENERATED), key=key) == sorted(objects, key=key)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_a_policy_edit_changes_the_pod_template(tmp_path: Path) -> None:
    """The worker reads its policy once at start: only a new pod template (a rollout) gets
    an edited policy to every replica."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)

    def template() -> Any:
        out = subprocess.run(["kubectl", "kustomize", str(copy / "base")], capture_output=True,
                             text=True, timeout=120, check=True).stdout
        (deployment,) = (d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
        return deployment["spec"]["template"]

    before = template()
    policy = copy / "base" / "policy.toml"
    policy.write_text(policy.read_text().replace("context_tokens = 1500", "context_tokens = 1400"))
    assert template() != before


# --------------------------------------------------------------------------- schemas


def test_builtin_objects_match_kubernetes_schemas(objects: list[Object]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for obj in objects:
        if obj["kind"] in KEDA_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            # strict: unknown fields (typos such as `readinesProbe`) are errors too.
            kv.validate(obj, version, strict=True)


def test_schema_validation_is_not_vacuous(workload: Object) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    broken = json.loads(json.dumps(workload))
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSIONS[0], strict=True)
    broken = json.loads(json.dumps(workload))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_scaled_object_matches_kedas_crd(k8s: dict[str, Object]) -> None:
    validator = _keda_validator()
    scaled = k8s["ScaledObject"]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(scaled)]
    assert not errors, errors
    for path, value in (
        (("spec", "minReplicaCount"), "1"),  # a string where the CRD wants an integer
        (("spec", "maxReplicas"), 6),  # no such field
        (("spec", "triggers", 0, "metadata", "lagThreshold"), 800),  # metadata is strings
        (("spec", "scaleTargetRef", "name"), None),
    ):
        broken = kustomize.altered(scaled, path, value)
        assert not validator.is_valid(broken), f"the CRD schema let {path} = {value!r} pass"


def test_compose_file_matches_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    interpolated = _interpolated(compose)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(interpolated)]
    assert not errors, errors
    broken = json.loads(json.dumps(interpolated))
    broken["services"]["worker"]["stop_grace_periods"] = "30s"
    assert not validator.is_valid(broken)


# --------------------------------------------------------------------------- the workload


def test_the_workload_runs_its_entry_points_guarantee(entry: str, k8s_env: dict[str, str]) -> None:
    guarantee = ENTRY_POINTS[entry][2]
    assert guarantee in PROCESSING_GUARANTEES
    assert k8s_env.get("ASSEMBLER_PROCESSING_GUARANTEE", "at_least_once") == guarantee


def test_the_statefulset_runs_the_deployments_pod_but_for_the_guarantee() -> None:
    """And for static membership: only a StatefulSet pod keeps its name (its instance id)."""
    def template(entry: str) -> Object:
        path, kind, _ = ENTRY_POINTS[entry]
        (workload,) = (o for o in kustomize.render(path) if o["kind"] == kind)
        spec: Object = json.loads(json.dumps(workload["spec"]["template"]))
        container = spec["spec"]["containers"][0]
        container["env"] = [e for e in container["env"]
                            if e["name"] != "ASSEMBLER_GROUP_INSTANCE_ID"]
        for entry_ in container["env"]:
            if entry_["name"] == "ASSEMBLER_PROCESSING_GUARANTEE":
                entry_["value"] = "?"
        return spec

    assert template("exactly-once") == template("base")


def test_statefulset_replicas_are_static_members_named_after_their_pods() -> None:
    path, kind, _ = ENTRY_POINTS["exactly-once"]
    (workload,) = (o for o in kustomize.render(path) if o["kind"] == kind)
    env = {e["name"]: e for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]}
    source = env["ASSEMBLER_GROUP_INSTANCE_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert source == "metadata.name"


def test_exactly_once_replicas_share_the_partitions_transactional_ids(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, kind, _ = ENTRY_POINTS["exactly-once"]
    objects = kustomize.render(path)
    k8s = _by_kind(objects)
    statefulset = k8s[kind]
    spec = statefulset["spec"]
    assert spec["podManagementPolicy"] == "Parallel"
    service = k8s["Service"]
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None", "a StatefulSet's governing Service is headless"
    (container,) = spec["template"]["spec"]["containers"]
    env = _container_env(objects, container)
    # Set per pod, the prefix would give a partition's owners different ids, and the next
    # owner could not fence the previous one: it is left to its default, the group id.
    assert "ASSEMBLER_TRANSACTIONAL_ID" not in env
    ids = set()
    for ordinal in range(2):  # two pods: their hostnames differ, their ids must not
        pod = f"{statefulset['metadata']['name']}-{ordinal}"
        monkeypatch.setattr(socket, "gethostname", lambda pod=pod: pod)
        settings = Settings(group_id=env["ASSEMBLER_GROUP_ID"])
        ids.add(settings.transactional_id_for(settings.input_topic, 0))
    assert ids == {f"{env['ASSEMBLER_GROUP_ID']}-{Settings().input_topic}-0"}


def test_probes_hit_health_and_ready_on_the_http_port(container: Object, http_port: int) -> None:
    liveness = container["livenessProbe"]["httpGet"]
    readiness = container["readinessProbe"]["httpGet"]
    assert liveness["path"] == "/health"
    assert readiness["path"] == "/ready"
    assert _resolve_port(liveness["port"], container) == http_port
    assert _resolve_port(readiness["port"], container) == http_port
    if "startupProbe" in container:
        startup = container["startupProbe"]["httpGet"]
        assert startup["path"] == "/health"
        assert _resolve_port(startup["port"], container) == http_port
    assert http_port in {int(p["containerPort"]) for p in container["ports"]}


def test_prometheus_scrape_annotations_point_at_metrics(workload: Object, http_port: int) -> None:
    annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
    assert annotations.get("prometheus.io/scrape") == "true"
    assert annotations["prometheus.io/port"] == str(http_port)
    assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"


def test_the_named_policy_is_mounted_at_policy_file(
    objects: list[Object], pod_spec: Object, container: Object, k8s_env: dict[str, str],
    tmp_path: Path,
) -> None:
    policy_file = k8s_env["ASSEMBLER_POLICY_FILE"]
    assert posixpath.isabs(policy_file)
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    found: tuple[str, str] | None = None
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]].get("configMap")
        if source is None:
            continue
        items = {i["path"]: i["key"] for i in source.get("items", [])}
        mount_path = posixpath.normpath(mount["mountPath"])
        if "subPath" in mount and mount_path == policy_file:
            found = source["name"], items.get(mount["subPath"], mount["subPath"])
        elif "subPath" not in mount and posixpath.dirname(policy_file) == mount_path:
            name = posixpath.basename(policy_file)
            found = source["name"], items.get(name, name)
        if found is not None:
            assert mount.get("readOnly") is True, "mount the policy read-only"
            break
    assert found is not None, f"no ConfigMap volume provides {policy_file}"
    configmap, key = found
    assert configmap in GENERATED, "the policy comes from a configMapGenerator (hash: rollout)"
    text = _configmap(objects, configmap)[key]
    assert isinstance(tomllib.loads(text).get("name"), str), "give the policy its `name`"
    (tmp_path / "policy.toml").write_text(text, encoding="utf-8")
    policy = load_policy(str(tmp_path / "policy.toml"))  # as the worker loads it at start
    assert policy.name == tomllib.loads(text)["name"]


def test_the_settings_come_from_one_configmap_and_are_all_known(
    objects: list[Object], k8s: dict[str, Object], container: Object, k8s_env: dict[str, str],
) -> None:
    (source,) = container["envFrom"]
    assert source["configMapRef"]["name"] == "context-assembler-settings"
    for name in k8s_env:
        assert name in KNOWN_SETTINGS | OTHER_VARIABLES, f"{name} is not a worker setting"
    missing = REQUIRED_IN_DEPLOYMENTS - set(k8s_env)
    assert not missing, f"the workload does not set {sorted(missing)}"
    assert 0 < int(k8s_env["ASSEMBLER_HTTP_PORT"]) < 65536
    assert k8s_env["ASSEMBLER_HTTP_HOST"] == "0.0.0.0", "probes come from outside the pod"
    assert k8s_env.get(ENDPOINT_VARIABLE, "") == "", "tracing is off unless an operator sets it"
    Settings.model_validate({  # the values are valid settings, too
        name.removeprefix(SETTINGS_PREFIX).lower(): value
        for name, value in k8s_env.items() if name.startswith(SETTINGS_PREFIX)
    })
    # The topics Job creates the topics the worker will use, from the same ConfigMap.
    (job_container,) = k8s["Job"]["spec"]["template"]["spec"]["containers"]
    job_env = _container_env(objects, job_container)
    for name in ("ASSEMBLER_BOOTSTRAP_SERVERS", *TOPIC_SETTINGS, "ASSEMBLER_MAX_MESSAGE_BYTES"):
        assert job_env.get(name) == k8s_env.get(name), name


def test_shutdown_finishes_before_the_kubelet_kills(
    pod_spec: Object, k8s_env: dict[str, str]
) -> None:
    field = Settings.model_fields["shutdown_grace_seconds"]
    grace = float(k8s_env.get("ASSEMBLER_SHUTDOWN_GRACE_SECONDS", field.default))
    termination = pod_spec.get("terminationGracePeriodSeconds", 30)
    assert grace + 5 <= termination <= 60, (grace, termination)


def test_resources_follow_the_measurements(container: Object) -> None:
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    # A busy worker uses about one core; a CPU limit would only throttle it mid-burst.
    assert resources["requests"]["cpu"] in {"1", "1000m"}
    assert "cpu" not in resources.get("limits", {})
    request = _memory_mib(resources["requests"]["memory"])
    limit = _memory_mib(resources["limits"]["memory"])
    assert request <= limit
    assert limit * 2**20 > WORKER_RSS_LIMIT_MB * 10**6


def test_pod_runs_as_the_images_non_root_user(
    pod_spec: Object, container: Object, image_user: tuple[int, int]
) -> None:
    security = {**pod_spec.get("securityContext", {}), **container.get("securityContext", {})}
    assert security.get("runAsNonRoot") is True
    assert security.get("allowPrivilegeEscalation") is False
    assert (security.get("runAsUser"), security.get("runAsGroup")) == image_user
    assert security.get("readOnlyRootFilesystem") is True
    # Everything the worker writes must land on a volume: its working directory and /tmp.
    mounted = {posixpath.normpath(m["mountPath"]) for m in container["volumeMounts"]}
    assert {"/tmp", "/app"} <= mounted


def test_container_keeps_the_image_entrypoint(container: Object) -> None:
    assert "command" not in container, "`command` would replace the context-assembler entrypoint"
    assert container["args"] == ["worker"]


def test_workers_spread_over_zones_and_nodes(workload: Object, pod_spec: Object) -> None:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    keys = set()
    for constraint in pod_spec["topologySpreadConstraints"]:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
        assert constraint["maxSkew"] == 1
        keys.add(constraint["topologyKey"])
    assert keys == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}


def test_rollouts_never_surge_past_the_partition_count(workload: Object) -> None:
    spec = workload["spec"]
    if workload["kind"] == "Deployment":
        # At maxReplicaCount == partitions a surge pod gets no partition, never passes
        # /ready, and the rollout stalls.
        assert spec["strategy"]["type"] == "RollingUpdate"
        assert spec["strategy"]["rollingUpdate"]["maxSurge"] == 0
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] >= 1
    else:  # a StatefulSet replaces a pod only once it is gone: it never surges
        assert spec.get("updateStrategy", {}).get("type", "RollingUpdate") == "RollingUpdate"
    assert "replicas" not in spec, "KEDA owns the replica count"


def test_selectors_match_pod_labels_and_the_pdb_lets_unhealthy_pods_go(
    k8s: dict[str, Object], workload: Object
) -> None:
    pod_labels = workload["spec"]["template"]["metadata"]["labels"]
    assert pod_labels.get(APP_LABEL[0]) == APP_LABEL[1]
    pdb = k8s["PodDisruptionBudget"]
    for kind, selector in ((workload["kind"], workload["spec"]["selector"]),
                           ("PodDisruptionBudget", pdb["spec"]["selector"])):
        assert "matchExpressions" not in selector, f"{kind}: keep selectors to matchLabels"
        assert selector["matchLabels"], f"{kind}: empty selector"
        assert selector["matchLabels"].items() <= pod_labels.items(), f"{kind} misses the pods"
    assert pdb["spec"]["maxUnavailable"] == 1
    # A worker that is not ready (no partition, a stuck delivery) must not block a drain.
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    job_labels = k8s["Job"]["spec"]["template"]["metadata"]["labels"]
    assert job_labels[APP_LABEL[0]] != APP_LABEL[1], "the Job's pods are not workers"


# --------------------------------------------------------------------------- KEDA


def test_keda_scales_the_workload_up_to_the_partition_count(
    k8s: dict[str, Object], workload: Object, partitions: int
) -> None:
    scaled = k8s["ScaledObject"]
    spec = scaled["spec"]
    documented = int(scaled["metadata"]["annotations"][PARTITIONS_ANNOTATION])
    assert documented == partitions, "k8s partition count disagrees with docker-compose.yml"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        workload["apiVersion"], workload["kind"], workload["metadata"]["name"])


def test_keda_reads_the_workers_own_group_topic_and_brokers(
    k8s: dict[str, Object], k8s_env: dict[str, str]
) -> None:
    (trigger,) = k8s["ScaledObject"]["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    metadata = trigger["metadata"]
    for key in metadata:
        assert key.removesuffix("FromEnv") in KEDA_KAFKA_KEYS, f"KEDA reads no {key}"
    for key in KEDA_KAFKA_FROM_ENV:
        assert key not in metadata, f"{key}: read it from the container (one place)"
    # KEDA resolves <name>FromEnv from the scale target's container (env and envFrom).
    assert k8s_env[metadata["bootstrapServersFromEnv"]] == k8s_env["ASSEMBLER_BOOTSTRAP_SERVERS"]
    assert metadata["consumerGroupFromEnv"] == "ASSEMBLER_GROUP_ID"
    assert metadata["topicFromEnv"] == "ASSEMBLER_INPUT_TOPIC"
    assert metadata["bootstrapServersFromEnv"] == "ASSEMBLER_BOOTSTRAP_SERVERS"
    for key in KEDA_KAFKA_BOOLEANS & set(metadata):
        assert metadata[key] in {"true", "false"}, key


def test_keda_scales_on_sustained_lag_in_even_steps(k8s: dict[str, Object]) -> None:
    spec = k8s["ScaledObject"]["spec"]
    (trigger,) = spec["triggers"]
    metadata = trigger["metadata"]
    assert int(metadata["lagThreshold"]) > COMMITTED_LAG_AT_CAPACITY
    assert metadata["offsetResetPolicy"] == "earliest"  # the worker's auto_offset_reset
    assert metadata.get("allowIdleConsumers", "false") == "false"
    # Replica counts that divide the partitions; KEDA refuses this with limitToPartitionsWithLag.
    assert metadata["ensureEvenDistributionOfPartitions"] == "true"
    assert metadata.get("limitToPartitionsWithLag", "false") == "false"
    # Each step goes straight to KEDA's (even) count: no HPA policy caps it below a full step.
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for direction in ("scaleUp", "scaleDown"):
        for policy in behavior[direction]["policies"]:
            assert policy["type"] == "Pods" and policy["value"] >= spec["maxReplicaCount"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300


def test_k8s_topics_job_runs_topics_create_for_the_partition_count(
    k8s: dict[str, Object], container: Object
) -> None:
    job = k8s["Job"]
    (job_container,) = job["spec"]["template"]["spec"]["containers"]
    assert job_container["image"] == container["image"]
    parsed = _topics_create(job_container["args"])
    annotations = k8s["ScaledObject"]["metadata"]["annotations"]
    assert parsed.partitions == int(annotations[PARTITIONS_ANNOTATION])
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    # Replicated topics where an acknowledged write survives the loss of one broker.
    assert parsed.replication_factor >= 3
    for spec in worker_topics(Settings(), parsed.partitions, parsed.replication_factor):
        assert spec.configs["min.insync.replicas"] == "2", spec.name


# --------------------------------------------------------------------------- compose


def test_compose_env_names_are_known_settings(worker_env: dict[str, str]) -> None:
    for name in worker_env:
        assert name in KNOWN_SETTINGS | OTHER_VARIABLES, f"{name} is not a worker setting"
    missing = REQUIRED_IN_DEPLOYMENTS - set(worker_env)
    assert not missing, f"compose does not set {sorted(missing)}"
    assert worker_env["ASSEMBLER_PROCESSING_GUARANTEE"] in PROCESSING_GUARANTEES
    assert worker_env["ASSEMBLER_HTTP_HOST"] == "0.0.0.0", "probes come from outside the container"
    assert worker_env.get(ENDPOINT_VARIABLE, "") == ""


def test_compose_and_k8s_agree_on_topics_and_group(worker_env: dict[str, str]) -> None:
    objects = kustomize.render(ENTRY_POINTS["base"][0])
    (container,) = _by_kind(objects)["Deployment"]["spec"]["template"]["spec"]["containers"]
    k8s_env = _container_env(objects, container)
    for name in (*TOPIC_SETTINGS, "ASSEMBLER_GROUP_ID", "ASSEMBLER_POLICY_FILE"):
        assert worker_env.get(name) == k8s_env.get(name), name


def test_compose_worker_is_scalable_and_stops_in_time(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    worker = services["worker"]
    assert "container_name" not in worker, "container_name prevents --scale"
    assert "ports" not in worker, "a fixed host port prevents --scale"
    build = worker["build"]
    assert (REPO / build.get("context", ".")).resolve() == REPO
    assert (REPO / build["dockerfile"]).resolve() == (REPO / "deploy" / "Dockerfile").resolve()
    assert worker["depends_on"] == {
        "kafka": {"condition": "service_healthy"},
        "topics": {"condition": "service_completed_successfully"},
    }
    assert services["kafka"]["healthcheck"].get("disable") is not True
    grace = float(worker_env.get("ASSEMBLER_SHUTDOWN_GRACE_SECONDS",
                                 Settings.model_fields["shutdown_grace_seconds"].default))
    stop = re.fullmatch(r"(\d+)s", worker["stop_grace_period"])
    assert stop is not None and grace + 5 <= int(stop.group(1))


def test_compose_mounts_the_policy_file(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    mounts = {item["target"]: item for item in services["worker"]["volumes"]}
    mount = mounts[worker_env["ASSEMBLER_POLICY_FILE"]]
    assert mount["type"] == "bind" and mount.get("read_only") is True
    source = REPO / mount["source"]
    # Long syntax: a missing source is refused instead of created as an empty directory.
    assert source.is_file(), f"{source} is missing"
    assert load_policy(str(source)).name == tomllib.loads(source.read_text())["name"]


def test_compose_kafka_is_single_node_kraft(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    kafka = services["kafka"]
    env = _compose_env(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert env["CLUSTER_ID"], "KRaft mode needs a CLUSTER_ID"
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    listeners = {
        name: address
        for name, _, address in (e.partition("://") for e in env["KAFKA_LISTENERS"].split(","))
    }
    voter_id, _, voter_address = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert voter_id == env["KAFKA_NODE_ID"]
    assert voter_address.rsplit(":", 1)[1] == listeners[controller].rsplit(":", 1)[1]
    # One broker: any replication factor or min ISR above 1 breaks groups/transactions.
    for name, value in env.items():
        if name.endswith(("_REPLICATION_FACTOR", "_MIN_ISR", "MIN_INSYNC_REPLICAS")):
            assert value == "1", name
    advertised = {e.split("://", 1)[1] for e in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    assert worker_env["ASSEMBLER_BOOTSTRAP_SERVERS"] in advertised


def test_compose_topics_runs_topics_create_with_the_workers_settings(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str], partitions: int
) -> None:
    topics_service = services["topics"]
    assert topics_service["image"] == services["worker"]["image"]
    assert topics_service["build"] == services["worker"]["build"]
    assert topics_service["depends_on"] == {"kafka": {"condition": "service_healthy"}}
    command = [str(word) for word in topics_service["command"]]
    assert "${PARTITIONS:-" in " ".join(command), "partitions must follow ${PARTITIONS}"
    parsed = _topics_create([_interpolate(word) for word in command])
    assert parsed.partitions == partitions
    assert parsed.replication_factor == 1
    env = _compose_env(topics_service)
    for name in ("ASSEMBLER_BOOTSTRAP_SERVERS", *TOPIC_SETTINGS, "ASSEMBLER_MAX_MESSAGE_BYTES"):
        assert env.get(name) == worker_env.get(name), name


# --------------------------------------------------------------------------- Kafka version


def test_one_kafka_version_for_compose_and_the_tests_broker(
    services: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    version = _dotenv()["KAFKA_VERSION"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    image = services["kafka"]["image"]
    assert re.fullmatch(r"apache/kafka:\$\{KAFKA_VERSION(:\?[^}]*)?\}", image), image
    assert _interpolate(image) == f"apache/kafka:{version}"
    # The Maven project names no version of its own: the harness passes .env's.
    pom = (REPO / "deploy" / "kafka" / "pom.xml").read_text(encoding="utf-8")
    assert "<kafka.version>" not in pom and "${kafka.version}" in pom
    # The harness reads the version from .env: with no Maven on PATH it says which it needs.
    result = subprocess.run(
        [sys.executable, "-m", "harness", "fetch"], cwd=REPO,
        capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "PATH": str(tmp_path), "KAFKA_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert result.returncode == 1
    assert f"'mvn' not found on PATH (Kafka {version} needs" in result.stderr
    # The README names the version the tests run.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert set(re.findall(r"Kafka (\d+\.\d+\.\d+)", readme)) == {version}


def test_the_image_tag_is_the_release_the_engine_names() -> None:
    """The manifests deploy the version every output names (worker/context_assembler/engine/version.py, which
    pyproject.toml reads too), so a release moves them together."""
    from context_assembler.engine.version import __version__

    component = yaml.safe_load((K8S / "components" / "image" / "kustomization.yaml").read_text())
    assert [image["newTag"] for image in component["images"]] == [__version__]
