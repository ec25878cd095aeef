"""The Helm chart (deploy/helm/context-assembler) rendered by `helm template`, and the values
each check renders it with: `make check-helm` validates these renders with kubeconform, and
tests/deploy/test_helm.py compares them with what kustomize renders from deploy/k8s.

The helm binary is built at a pinned version from the Go module proxy (the Makefile's HELM).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.kustomize import Object

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "context-assembler"
#: The release name that gives the objects deploy/k8s's names.
RELEASE = "context-assembler"
#: Values for each render kubeconform checks: the kustomize entry points' twins, each with
#: monitoring, the secured-cluster Secret and KEDA authenticating from it, Amazon MSK's IAM
#: trigger, and no KEDA.
CASES: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "exactly-once": ("--set", "guarantee=exactly_once"),
    "monitoring": ("--set", "monitoring.enabled=true"),
    "exactly-once+monitoring": ("--set", "guarantee=exactly_once",
                                "--set", "monitoring.enabled=true"),
    "secured": ("--set", "kafkaSecret.stringData.username=context-assembler",
                "--set", "kafkaSecret.stringData.password=not-a-real-password",
                "--set", "keda.authenticate=true",
                "--set", "keda.metadata.sasl=scram_sha512", "--set", "keda.metadata.tls=enable"),
    "msk-iam": ("--set", "keda.authenticate=true",
                "--set", "keda.metadata.sasl=aws_msk_iam", "--set", "keda.metadata.tls=enable",
                "--set", "keda.metadata.awsRegion=eu-west-1",
                "--set", "keda.triggerAuthentication.podIdentity.provider=aws",
                "--set", "keda.triggerAuthentication.podIdentity.identityOwner=workload",
                "--set", "serviceAccountName=context-assembler",
                "--set", "settings.ASSEMBLER_SECURITY_PROTOCOL=SASL_SSL",
                "--set", "settings.ASSEMBLER_SASL_MECHANISM=OAUTHBEARER",
                "--set", "settings.ASSEMBLER_SASL_OAUTH_PROVIDER=aws_msk_iam",
                "--set", "settings.ASSEMBLER_AWS_REGION=eu-west-1"),
    "no-keda-no-job": ("--set", "keda.enabled=false", "--set", "topics.createJob=false"),
}


def template(helm: str, *args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
    """`helm template RELEASE CHART ARGS...`, its output captured."""
    return subprocess.run([helm, "template", RELEASE, str(chart), *args], capture_output=True,
                          text=True, timeout=120, check=False)


def render(helm: str, *args: str, chart: Path = CHART) -> list[Object]:
    """The objects the chart renders with these arguments (--set, -f, --set-file)."""
    result = template(helm, *args, chart=chart)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
