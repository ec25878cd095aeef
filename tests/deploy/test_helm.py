"""The Helm chart renders what kustomize renders from deploy/k8s, object by object: its
defaults the base, guarantee=exactly_once the exactly-once overlay, monitoring.enabled the
monitoring component on either, keda.enabled=false and topics.createJob=false the base less
those objects; and what only the chart does (the Secret, the hashed ConfigMap names, another
release name, the values schema) behaves.

Needs the helm binary the Makefile builds (`make check-helm` builds it and runs this file):
skipped where it is not built, except under CI, where it must be.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_assembler.kafka.clients import kafka_security
from context_assembler.kafka.msk_iam import MskIamTokenProvider
from context_assembler.settings import Settings
from tests.deploy import helm, kustomize
from tests.deploy.kubeconform import check, renders
from tests.deploy.kustomize import Object
from tests.deploy.test_manifests import GENERATED, K8S, REPO

VENV_TARGET = ".venv/bin/context-assembler"
KEDA_KINDS = {"ScaledObject", "TriggerAuthentication"}


def _tool(variable: str) -> Path:
    """A tool the Makefile builds into .tools/, by its variable there."""
    printed = subprocess.run(
        ["make", "--no-print-directory", "-o", VENV_TARGET, "--eval", "print-%: ; @echo $($*)",
         "-s", f"print-{variable}"], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=False)
    assert printed.returncode == 0, printed.stderr
    return REPO / printed.stdout.strip()


HELM = _tool("HELM")
pytestmark = pytest.mark.skipif(
    not HELM.is_file() and not os.environ.get("CI"),
    reason="helm is not built (make check-helm builds it)",
)


def _render(*args: str) -> list[Object]:
    return helm.render(str(HELM), *args)


def _comparable(objects: list[Object]) -> list[Object]:
    """Objects as compared: the generated ConfigMaps' hash suffixes taken off (kustomize's and
    the chart's hashes differ), the policy as parsed TOML (its file's comments are about
    kustomize), sorted by kind and name."""
    normalised = kustomize.normalise(copy.deepcopy(objects), GENERATED)
    for obj in normalised:
        if obj["kind"] == "ConfigMap" and "policy.toml" in obj["data"]:
            obj["data"]["policy.toml"] = tomllib.loads(obj["data"]["policy.toml"])
    return sorted(normalised, key=kustomize.identity)


@pytest.fixture(scope="module")
def kustomized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Object]]:
    """Each kustomize entry point, alone and with each component (as kubeconform checks them)."""
    return renders(K8S, tmp_path_factory.mktemp("kustomizations"))


@pytest.mark.parametrize(("case", "kustomization"), [
    ("defaults", "base"),
    ("exactly-once", "exactly-once"),
    ("monitoring", "base+monitoring"),
    ("exactly-once+monitoring", "exactly-once+monitoring"),
])
def test_the_chart_renders_what_kustomize_renders(
    kustomized: dict[str, list[Object]], case: str, kustomization: str,
) -> None:
    chart = _comparable(_render(*helm.CASES[case]))
    expected = _comparable(kustomized[kustomization])
    assert [kustomize.identity(obj) for obj in chart] == [
        kustomize.identity(obj) for obj in expected]
    for ours, theirs in zip(chart, expected, strict=True):
        assert ours == theirs, kustomize.identity(ours)


def test_without_keda_or_the_job_the_rest_is_the_base(kustomized: dict[str, list[Object]]) -> None:
    chart = _comparable(_render(*helm.CASES["no-keda-no-job"]))
    base = [obj for obj in _comparable(kustomized["base"])
            if obj["kind"] not in KEDA_KINDS | {"Job"}]
    assert chart == base


def test_the_secured_case_adds_the_secret_the_pods_mount_and_keda_reads(
    kustomized: dict[str, list[Object]],
) -> None:
    chart = {kustomize.identity(obj): obj for obj in _render(*helm.CASES["secured"])}
    secret = chart.pop(("Secret", "context-assembler-kafka"))
    assert secret["stringData"] == {"username": "context-assembler",
                                    "password": "not-a-real-password"}
    # The ScaledObject as deploy/k8s/base/keda-scaledobject.yaml says to edit it for SCRAM.
    base = {kustomize.identity(obj): obj for obj in _comparable(kustomized["base"])}
    scaled = copy.deepcopy(base[("ScaledObject", "context-assembler")])
    (trigger,) = scaled["spec"]["triggers"]
    trigger["authenticationRef"] = {"name": "context-assembler-kafka"}
    trigger["metadata"].update(sasl="scram_sha512", tls="enable")
    assert _comparable(list(chart.values())) == sorted(
        [scaled if obj["kind"] == "ScaledObject" else obj for obj in base.values()],
        key=kustomize.identity)
    for obj in chart.values():  # every pod mounts the Secret, optional and read-only
        template = obj.get("spec", {}).get("template")
        if template:
            (volume,) = [v for v in template["spec"]["volumes"] if "secret" in v]
            assert volume["secret"]["secretName"] == secret["metadata"]["name"]


def test_msk_iam_runs_the_workers_and_keda_as_the_pods_iam_role() -> None:
    objects = _render(*helm.CASES["msk-iam"])
    chart = {obj["kind"]: obj for obj in objects if obj["kind"] != "ConfigMap"}
    (trigger,) = chart["ScaledObject"]["spec"]["triggers"]
    assert trigger["authenticationRef"] == {"name": "context-assembler-kafka"}
    assert {key: trigger["metadata"][key] for key in ("sasl", "tls", "awsRegion")} == {
        "sasl": "aws_msk_iam", "tls": "enable", "awsRegion": "eu-west-1"}
    assert chart["TriggerAuthentication"]["spec"] == {
        "podIdentity": {"provider": "aws", "identityOwner": "workload"}}
    assert "Secret" not in chart
    for kind in ("Deployment", "Job"):  # the service account the IAM role is associated with
        assert chart[kind]["spec"]["template"]["spec"].get("serviceAccountName") == (
            "context-assembler" if kind == "Deployment" else None)
    # The settings the worker reads are coherent: they load, and select AWS's signer.
    settings = _named(objects, "ConfigMap", "context-assembler-settings-")["data"]
    fields: dict[str, Any] = {name.removeprefix("ASSEMBLER_").lower(): value
                              for name, value in settings.items()
                              if name.startswith("ASSEMBLER_")}
    security = kafka_security(Settings(**fields))
    assert isinstance(security.token_provider, MskIamTokenProvider)


def _named(objects: list[Object], kind: str, prefix: str) -> Object:
    (found,) = [obj for obj in objects
                if obj["kind"] == kind and obj["metadata"]["name"].startswith(prefix)]
    return found


def _references(workload: Object) -> set[str]:
    spec = workload["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return ({v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
            | {ref["configMapRef"]["name"] for ref in container["envFrom"]})


def test_an_edit_of_the_policy_or_a_setting_renames_its_configmap_and_rolls_the_pods(
    tmp_path: Path,
) -> None:
    default = _render()
    policy = tmp_path / "policy.toml"
    policy.write_text('name = "mine"\n\n[budget]\ncontext_tokens = 900\n', encoding="utf-8")
    edited = _render("--set-file", f"policy={policy}",
                     "--set", "settings.ASSEMBLER_GROUP_ID=other",
                     "--set", "settings.OTEL_EXPORTER_OTLP_ENDPOINT=null")
    for prefix in ("context-assembler-policy-", "context-assembler-settings-"):
        before, after = (_named(objs, "ConfigMap", prefix) for objs in (default, edited))
        assert before["metadata"]["name"] != after["metadata"]["name"]
        assert after["metadata"]["name"] in _references(_named(edited, "Deployment", "context"))
    (job_container,) = _named(edited, "Job", "context")["spec"]["template"]["spec"]["containers"]
    assert job_container["envFrom"] == [{"configMapRef": {"name": after["metadata"]["name"]}}]
    policy_map = _named(edited, "ConfigMap", "context-assembler-policy-")
    assert policy_map["data"] == {"policy.toml": policy.read_text(encoding="utf-8")}
    settings = _named(edited, "ConfigMap", "context-assembler-settings-")["data"]
    assert settings["ASSEMBLER_GROUP_ID"] == "other"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in settings  # null drops a default


def test_another_release_name_names_every_object_and_selector_after_it() -> None:
    result = subprocess.run([str(HELM), "template", "prod", str(helm.CHART), "--set",
                             "monitoring.enabled=true"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    for obj in objects:
        assert obj["metadata"]["name"].startswith("prod-context-assembler"), obj["metadata"]
    by_kind = {obj["kind"]: obj for obj in objects if obj["kind"] != "ConfigMap"}
    pod_labels = by_kind["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for kind in ("Deployment", "PodDisruptionBudget", "PodMonitor"):
        selector = by_kind[kind]["spec"]["selector"]["matchLabels"]
        assert selector == {"app.kubernetes.io/name": "prod-context-assembler"}
        assert selector.items() <= pod_labels.items()
    assert by_kind["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == "prod-context-assembler"


@pytest.mark.parametrize(("args", "complaint"), [
    (("--set", "guarantee=exactly-once"), "guarantee"),
    (("--set", "topics.partitions=0"), "partitions"),
    (("--set", "settings.assembler_group_id=x"), "assembler_group_id"),
    (("--set", "monitoring.enable=true"), "enable"),
], ids=["guarantee", "partitions", "setting-name", "misspelt-key"])
def test_the_values_schema_refuses_a_wrong_value(args: tuple[str, ...], complaint: str) -> None:
    result = helm.template(str(HELM), *args)
    assert result.returncode != 0
    assert complaint in result.stderr


def test_the_chart_deploys_the_release_the_engine_names_and_carries_alerts_yaml() -> None:
    from context_assembler.engine.version import __version__

    chart = yaml.safe_load((helm.CHART / "Chart.yaml").read_text(encoding="utf-8"))
    values = yaml.safe_load((helm.CHART / "values.yaml").read_text(encoding="utf-8"))
    assert chart["appVersion"] == values["image"]["tag"] == __version__
    alerts = REPO / "deploy" / "prometheus" / "alerts.yaml"
    assert (helm.CHART / "files" / "alerts.yaml").read_bytes() == alerts.read_bytes(), (
        "run `make prometheus-rule`")


def test_kubeconform_refuses_a_chart_that_renders_a_wrong_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    kubeconform = _tool("KUBECONFORM")
    if not kubeconform.is_file():
        pytest.skip("kubeconform is not built (make check-kubeconform builds it)")
    chart = tmp_path / "context-assembler"
    shutil.copytree(helm.CHART, chart)
    assert check(str(kubeconform), K8S, str(HELM), chart) == 0
    template = chart / "templates" / "_helpers.tpl"
    text = template.read_text(encoding="utf-8")
    assert "readinessProbe:" in text
    template.write_text(text.replace("readinessProbe:", "readinesProbe:"), encoding="utf-8")
    capsys.readouterr()
    assert check(str(kubeconform), K8S, str(HELM), chart) != 0
    assert "Deployment context-assembler is invalid" in capsys.readouterr().out


def test_the_partition_count_sizes_the_job_and_caps_keda_together() -> None:
    chart = {obj["kind"]: obj for obj in _render("--set", "topics.partitions=3",
                                                 "--set", "topics.replicationFactor=1")
             if obj["kind"] != "ConfigMap"}
    scaled = chart["ScaledObject"]
    assert scaled["metadata"]["annotations"]["context-assembler/input-partitions"] == "3"
    assert scaled["spec"]["maxReplicaCount"] == 3
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert {policy["value"] for direction in behavior.values()
            for policy in direction["policies"]} == {3}
    (container,) = chart["Job"]["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["topics", "create", "--partitions", "3",
                                 "--replication-factor", "1"]
