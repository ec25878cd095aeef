"""The shell blocks of docs/deploy.md that need no cluster, run as they stand, each in a fresh
bash from the repository's directory (tests/test_docs.py checks that every shell block is run
or checked somewhere)."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.deploy import helm
from tests.deploy.test_helm import HELM
from tests.deploy.test_manifests import K8S, REPO
from tests.support.docs import section_blocks

DEPLOY = "docs/deploy.md"


def _run(heading: str) -> subprocess.CompletedProcess[str]:
    """The one shell block under `heading`, in a shell with no ASSEMBLER_ variable and no
    virtualenv active."""
    (block,) = [b.text for b in section_blocks(DEPLOY, heading) if b.is_shell]
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("ASSEMBLER_", "VIRTUAL_ENV"))}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_strimzi_block_prints_the_components_kafkatopics() -> None:
    result = _run("### Topics as Strimzi KafkaTopics")
    assert result.returncode == 0, result.stderr
    printed = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    shipped = [doc for doc in yaml.safe_load_all(
        (K8S / "components" / "strimzi-topics" / "kafkatopics.yaml").read_text()) if doc]
    assert printed == shipped


@pytest.mark.skipif(not HELM.is_file() and not os.environ.get("CI"),
                    reason="helm is not built (make check-helm builds it)")
def test_the_render_block_lints_and_renders_the_exactly_once_chart() -> None:
    result = _run("### Render the chart")
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(
        result.stdout[result.stdout.index("---"):]) if doc]
    kinds = sorted(obj["kind"] for obj in objects)
    assert "StatefulSet" in kinds and "PrometheusRule" in kinds and "Deployment" not in kinds
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    assert all(obj["metadata"]["name"].startswith(helm.RELEASE) for obj in objects)
