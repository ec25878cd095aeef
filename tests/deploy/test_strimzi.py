"""deploy/k8s/components/strimzi-topics: the worker's topics as Strimzi KafkaTopics, in place of
the topics Job. The component's kafkatopics.yaml is `context-assembler topics --format
strimzi`'s output for deploy/k8s's settings, and every KafkaTopic satisfies Strimzi's CRD
(vendored in schemas/, its openAPIV3Schema made strict as `kubectl apply` is)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from context_assembler.cli.main import main
from context_assembler.kafka.tools.topics import strimzi_kafka_topics, strimzi_resource_name
from context_assembler.kafka.tools.topics import worker_topics as topic_table
from context_assembler.settings import Settings
from tests.deploy import kustomize
from tests.deploy.kubeconform import strict_schema
from tests.deploy.kustomize import Object
from tests.deploy.test_manifests import ENTRY_POINTS, K8S, PARTITIONS_ANNOTATION, SCHEMAS

COMPONENT = K8S / "components" / "strimzi-topics"
TOPICS_FILE = COMPONENT / "kafkatopics.yaml"
#: How the component's file is written (its kustomization.yaml says so too).
COMMAND = ["topics", "--format", "strimzi", "--partitions", "6", "--replication-factor", "3"]


def _crd_validator() -> jsonschema.Draft7Validator:
    (crd,) = kustomize.load_yaml(SCHEMAS / "kafka.strimzi.io_kafkatopics.yaml")
    (version,) = crd["spec"]["versions"]
    assert f"{crd['spec']['group']}/{version['name']}" == "kafka.strimzi.io/v1"
    return jsonschema.Draft7Validator(strict_schema(version["schema"]["openAPIV3Schema"]))


def _topics() -> list[Object]:
    return kustomize.load_yaml(TOPICS_FILE)


def test_the_components_file_is_what_the_command_prints_for_the_deployed_settings(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [name for name in os.environ if name.startswith("ASSEMBLER_")]:
        monkeypatch.delenv(name)
    for name, value in kustomize.parse_env_file(K8S / "base" / "settings.env").items():
        monkeypatch.setenv(name, value)
    assert main(COMMAND) == 0
    assert TOPICS_FILE.read_text(encoding="utf-8") == capsys.readouterr().out, (
        "write it again: context-assembler " + " ".join(COMMAND))


def test_the_kafkatopics_carry_the_topic_table_topics_create_uses() -> None:
    deployed: dict[str, Any] = {
        name.removeprefix("ASSEMBLER_").lower(): value
        for name, value in kustomize.parse_env_file(K8S / "base" / "settings.env").items()
        if name.startswith("ASSEMBLER_")}
    settings = Settings(**deployed)
    specs = topic_table(settings, 6, 3)
    topics = _topics()
    assert [topic["metadata"]["name"] for topic in topics] == [spec.name for spec in specs]
    for topic, spec in zip(topics, specs, strict=True):
        assert topic["spec"]["partitions"] == spec.partitions
        assert topic["spec"]["replicas"] == spec.replication_factor
        assert {name: str(value) for name, value in topic["spec"]["config"].items()} == (
            spec.configs)
        assert topic["spec"]["config"]["min.insync.replicas"] == 2
    policies = topics[-1]["spec"]["config"]
    assert topics[-1]["metadata"]["name"] == settings.policies_topic
    assert policies["cleanup.policy"] == "compact"
    # The input topic's partitions are what KEDA sizes the replica count for.
    scaled = next(obj for obj in kustomize.render(K8S / "base") if obj["kind"] == "ScaledObject")
    assert topics[0]["spec"]["partitions"] == int(
        scaled["metadata"]["annotations"][PARTITIONS_ANNOTATION])


def test_every_kafkatopic_satisfies_strimzis_crd() -> None:
    validator = _crd_validator()
    for topic in _topics():
        assert (topic["apiVersion"], topic["kind"]) == ("kafka.strimzi.io/v1", "KafkaTopic")
        assert list(validator.iter_errors(topic)) == []


@pytest.mark.parametrize(("path", "value"), [
    (("spec", "partitions"), 0),
    (("spec", "replicas"), "3"),
    (("spec", "replicationFactor"), 3),  # not a field of the CRD
    (("spec", "topicName"), 7),
], ids=["no-partitions", "replicas-text", "unknown-field", "name-not-text"])
def test_the_crd_refuses_a_broken_kafkatopic(path: tuple[str, ...], value: object) -> None:
    assert list(_crd_validator().iter_errors(kustomize.altered(_topics()[0], path, value)))


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_the_component_replaces_the_topics_job_with_the_kafkatopics(
    entry: str, tmp_path: Path,
) -> None:
    copied = tmp_path / "k8s"
    shutil.copytree(K8S, copied)
    user = copied / "overlays" / "with-strimzi"
    user.mkdir()
    (user / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"../../{ENTRY_POINTS[entry][0].relative_to(K8S)}"],
        "components": ["../../components/strimzi-topics"],
    }), encoding="utf-8")
    rendered = kustomize.render(user)
    plain = kustomize.render(ENTRY_POINTS[entry][0])
    assert [obj for obj in rendered if obj["kind"] != "KafkaTopic"] == [
        obj for obj in plain if obj["kind"] != "Job"]
    assert [obj for obj in rendered if obj["kind"] == "KafkaTopic"] == _topics()


@pytest.mark.parametrize("topic", ["retrieval.results", "Retrieval_Results", "a" * 249, "___"])
def test_a_topic_name_kubernetes_refuses_gets_a_resource_name_and_its_topicname(
    topic: str,
) -> None:
    (spec,) = [s for s in topic_table(Settings(input_topic=topic), 1, 1) if s.name == topic]
    (resource,) = [doc for doc in yaml.safe_load_all(strimzi_kafka_topics([spec], "c"))]
    name = resource["metadata"]["name"]
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", name) and len(name) <= 253
    assert resource["spec"].get("topicName", name) == topic
    assert list(_crd_validator().iter_errors(resource)) == []


def test_topic_names_that_differ_only_in_case_get_different_resources() -> None:
    assert strimzi_resource_name("Prompts") != strimzi_resource_name("PROMPTS")


def test_the_cluster_label_is_the_one_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topics", "--format", "strimzi", "--strimzi-cluster", "prod-kafka"]) == 0
    topics: list[dict[str, Any]] = list(yaml.safe_load_all(capsys.readouterr().out))
    assert {topic["metadata"]["labels"]["strimzi.io/cluster"] for topic in topics} == {
        "prod-kafka"}
    assert len(topics) == len(topic_table(Settings(), 1, 1))
