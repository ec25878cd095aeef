"""`make check-kubeconform`: it passes on deploy/k8s and fails on a copy with one wrong field,
whether in a built-in object, a CRD's object or a component's, or on a kind with no schema.

Skipped where kubeconform is not built yet (CI builds it: `make check-deploy` runs first)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.test_manifests import K8S

REPO = Path(__file__).resolve().parents[2]
VENV_TARGET = ".venv/bin/context-assembler"


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    # -o: the venv counts as made, so a test never reinstalls the environment it runs in.
    return subprocess.run(["make", "--no-print-directory", "-o", VENV_TARGET, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)


def _kubeconform() -> Path:
    printed = _make("--eval", "print-%: ; @echo $($*)", "-s", "print-KUBECONFORM")
    assert printed.returncode == 0, printed.stderr
    return REPO / printed.stdout.strip()


pytestmark = pytest.mark.skipif(
    shutil.which("make") is None or not _kubeconform().is_file(),
    reason="kubeconform is not built (make check-kubeconform builds it)",
)


def test_the_manifests_pass_and_every_object_is_counted() -> None:
    result = _make("check-kubeconform")
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("base", "exactly-once", "base+monitoring", "exactly-once+monitoring",
                 "base+strimzi-topics", "exactly-once+strimzi-topics"):
        assert f"\n{name}: " in f"\n{result.stdout}"
    assert result.stdout.count("Invalid: 0, Errors: 0, Skipped: 0") == 2


@pytest.mark.parametrize(("file", "old", "new", "complaint"), [
    ("base/deployment.yaml", "readinessProbe:", "readinesProbe:",
     "Deployment context-assembler is invalid"),
    ("base/keda-trigger-authentication.yaml", "secretTargetRef:", "secretTargetRefs:",
     "TriggerAuthentication context-assembler-kafka is invalid"),
    ("base/keda-scaledobject.yaml", "minReplicaCount: 1", 'minReplicaCount: "1"',
     "ScaledObject context-assembler is invalid"),
    ("components/monitoring/podmonitor.yaml", "podMetricsEndpoints:", "podMetricEndpoints:",
     "PodMonitor context-assembler is invalid"),
    ("components/strimzi-topics/kafkatopics.yaml", "  replicas: 3", "  replica: 3",
     "KafkaTopic retrieval.results is invalid"),
    ("base/pdb.yaml", "apiVersion: policy/v1", "apiVersion: policy/v1beta7",
     "could not find schema for PodDisruptionBudget"),
], ids=["built-in", "keda-crd", "keda-type", "component", "strimzi-crd", "no-schema"])
def test_a_wrong_field_fails_the_check(tmp_path: Path, file: str, old: str, new: str,
                                       complaint: str) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    text = (copy / file).read_text(encoding="utf-8")
    assert old in text, f"{file} no longer has {old!r}: pick another field to break"
    (copy / file).write_text(text.replace(old, new, 1), encoding="utf-8")
    result = _make("check-kubeconform", f"K8S_DIR={copy}")
    assert result.returncode != 0
    assert complaint in result.stdout, result.stdout + result.stderr
