"""deploy/k8s/components/monitoring: the prometheus-operator's PodMonitor and PrometheusRule.

The component is added to either entry point (base or overlays/exactly-once) by a user's own
kustomization; here that kustomization is written next to a copy of deploy/k8s and rendered
by tests/deploy/kustomize.py (and by `kubectl kustomize` where kubectl is installed). The
operator's CRDs are not in kubernetes-validate: the two objects are validated against the
schema in tests/deploy/schemas/monitoring.coreos.com.json.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.deploy import kustomize
from tests.deploy.kustomize import Object
from tests.deploy.test_manifests import APP_LABEL, ENTRY_POINTS, GENERATED, K8S, SCHEMAS

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
COMPONENT = K8S / "components" / "monitoring"
RULE = COMPONENT / "prometheusrule.yaml"
KINDS = ("PodMonitor", "PrometheusRule")


@pytest.fixture(scope="module", params=sorted(ENTRY_POINTS))
def entry(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def monitored(entry: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's kustomization: an entry point plus the monitoring component."""
    copy = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, copy)
    path = ENTRY_POINTS[entry][0].relative_to(K8S)
    directory = copy / "overlays" / "monitored"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"../../{path}"], "components": ["../../components/monitoring"],
    }), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def objects(monitored: Path) -> list[Object]:
    return kustomize.render(monitored)


def _one(objects: list[Object], kind: str) -> Object:
    (found,) = (obj for obj in objects if obj["kind"] == kind)
    return found


def _validator(kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / "monitoring.coreos.com.json").read_text(encoding="utf-8"))
    return jsonschema.Draft7Validator({**schema, "$ref": f"#/definitions/{kind}"})


def test_the_component_adds_only_the_monitoring_objects(entry: str,
                                                        objects: list[Object]) -> None:
    plain = kustomize.render(ENTRY_POINTS[entry][0])
    assert [obj for obj in objects if obj["kind"] not in KINDS] == plain
    assert {kustomize.identity(obj) for obj in objects if obj["kind"] in KINDS} == {
        (kind, "context-assembler") for kind in KINDS}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_render_is_what_kubectl_kustomize_makes(monitored: Path,
                                                    objects: list[Object]) -> None:
    result = subprocess.run(["kubectl", "kustomize", str(monitored)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    key = kustomize.identity
    assert sorted(kustomize.normalise(rendered, GENERATED), key=key) == sorted(objects, key=key)


@pytest.mark.parametrize("kind", KINDS)
def test_the_objects_match_the_operators_schema(objects: list[Object], kind: str) -> None:
    validator = _validator(kind)
    obj = _one(objects, kind)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(obj)]
    assert not errors, errors


@pytest.mark.parametrize(("kind", "path", "value"), [
    ("PodMonitor", ("spec", "podMetricEndpoints"), []),  # a misspelt field
    ("PodMonitor", ("spec", "podMetricsEndpoints", 0, "interval"), "30 seconds"),
    ("PodMonitor", ("spec", "selector"), None),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "for"), "5 minutes"),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "expr"), None),
    ("PrometheusRule", ("spec", "groups", 0, "rules", 0, "labels", "severity"), 2),
])
def test_the_schema_refuses_a_broken_object(
    objects: list[Object], kind: str, path: tuple[str | int, ...], value: object
) -> None:
    broken = kustomize.altered(_one(objects, kind), path, value)
    assert not _validator(kind).is_valid(broken), f"{kind}: {path} = {value!r} passed"


def test_the_podmonitor_scrapes_each_workers_metrics(objects: list[Object]) -> None:
    monitor = _one(objects, "PodMonitor")["spec"]
    (workload,) = (obj for obj in objects if obj["kind"] in {"Deployment", "StatefulSet"})
    template = workload["spec"]["template"]
    pod_labels = template["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "namespaceSelector" not in monitor, "its own namespace only: one deployment"
    # `job` is the app name, the same label value for the Deployment and the StatefulSet.
    assert pod_labels[monitor["jobLabel"]] == APP_LABEL[1]
    (container,) = template["spec"]["containers"]
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] in {port["name"] for port in container["ports"]}
    assert endpoint["path"] == template["metadata"]["annotations"]["prometheus.io/path"]
    job = _one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not monitor["selector"]["matchLabels"].items() <= job.items(), "not the topics Job"


def test_the_prometheusrule_carries_alerts_yaml_unchanged() -> None:
    (rule,) = kustomize.load_yaml(RULE)
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text(encoding="utf-8")), (
        "regenerate it: make prometheus-rule"
    )
    # Comments and layout too: the Makefile indents alerts.yaml from `groups:` on.
    groups = ALERTS.read_text(encoding="utf-8").split("\ngroups:\n", 1)[1]
    indented = re.sub(r"(?m)^(?=.)", "  ", groups)
    assert RULE.read_text(encoding="utf-8").endswith("\n  groups:\n" + indented)
