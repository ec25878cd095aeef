"""`context-assembler acls`: the worker's least-privilege bindings, as the docs list them."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from context_assembler.cli.main import main
from context_assembler.kafka.tools.acls import worker_acls
from context_assembler.settings import Settings
from tests.deploy import kustomize
from tests.deploy.kubeconform import strict_schema
from tests.deploy.test_manifests import SCHEMAS

DOC = Path(__file__).resolve().parents[3] / "docs" / "secured-cluster.md"


def bindings(settings: Settings) -> set[tuple[str, str, str, str]]:
    return {b for acl in worker_acls(settings) for b in acl.bindings()}


def test_the_bindings_are_the_documented_least_privilege_set() -> None:
    settings = Settings(transactional_id="tx", processing_guarantee="exactly_once")
    expected = {
        ("TOPIC", "retrieval.results", "LITERAL", "READ"),
        ("TOPIC", "retrieval.results", "LITERAL", "DESCRIBE"),
        ("GROUP", "context-assembler", "LITERAL", "READ"),
        *((("TOPIC", topic, "LITERAL", op)) for topic in (
            "prompts.assembled", "context.audit", "retrieval.results.dlq", "assembler.policies")
          for op in ("WRITE", "DESCRIBE")),
        ("TRANSACTIONAL_ID", "tx-", "PREFIXED", "WRITE"),
        ("TRANSACTIONAL_ID", "tx-", "PREFIXED", "DESCRIBE"),
    }
    assert bindings(settings) == expected
    # Every transactional id the worker uses falls under the prefix granted.
    assert settings.transactional_id_for("retrieval.results", 3).startswith("tx-")
    # at_least_once uses no transactions, so it is granted none.
    assert not any(b[0] == "TRANSACTIONAL_ID" for b in bindings(Settings()))


def test_the_docs_table_lists_the_same_operations() -> None:
    rows = re.findall(r"^\| (Topic|Group|TransactionalId) \|[^|]*\| (literal|prefixed) \| "
                      r"([A-Z, ]+) \|", DOC.read_text(), flags=re.MULTILINE)
    documented = {(kind.upper().replace("TRANSACTIONALID", "TRANSACTIONAL_ID"), pattern.upper(),
                   tuple(op.strip() for op in ops.split(","))) for kind, pattern, ops in rows}
    coded = {(acl.resource, acl.pattern, acl.operations)
             for acl in worker_acls(Settings(processing_guarantee="exactly_once"))}
    assert documented == coded


def test_kafka_acls_commands_name_the_configured_topics_group_and_prefix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ASSEMBLER_INPUT_TOPIC", "in.put")
    monkeypatch.setenv("ASSEMBLER_PROCESSING_GUARANTEE", "exactly_once")
    monkeypatch.setenv("ASSEMBLER_GROUP_ID", "g $(id)'")  # a group id Kafka takes; quoted
    assert main(["acls", "--principal", "User:svc", "--bootstrap-servers", "k:9093"]) == 0
    granted = set()
    for line in capsys.readouterr().out.splitlines():
        words = shlex.split(line)
        assert words[:8] == ["kafka-acls", "--bootstrap-server", "k:9093", "--command-config",
                             "admin.properties", "--add", "--allow-principal", "User:svc"]
        operations = [words[i + 1] for i, w in enumerate(words) if w == "--operation"]
        (resource,) = [(w, words[i + 1]) for i, w in enumerate(words)
                       if w in {"--topic", "--group", "--transactional-id"}]
        prefixed = "--resource-pattern-type" in words
        granted |= {(resource, op, prefixed) for op in operations}
    assert (("--topic", "in.put"), "Read", False) in granted
    assert (("--group", "g $(id)'"), "Read", False) in granted
    assert (("--transactional-id", "g $(id)'-"), "Write", True) in granted
    assert len(granted) == 13  # 11, and the transactional prefix's 2


def test_the_strimzi_user_grants_the_same_acls(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["acls", "--principal", "User:CN=svc", "--format", "strimzi",
                 "--strimzi-cluster", "prod"]) == 0
    user = yaml.safe_load(capsys.readouterr().out)
    assert user["kind"] == "KafkaUser" and user["apiVersion"] == "kafka.strimzi.io/v1"
    assert user["metadata"] == {"name": "svc", "labels": {"strimzi.io/cluster": "prod"}}
    # Strimzi's own CRD (1.2.0, which serves v1 only) accepts it.
    (crd,) = kustomize.load_yaml(SCHEMAS / "kafka.strimzi.io_kafkausers.yaml")
    (version,) = crd["spec"]["versions"]
    assert f"{crd['spec']['group']}/{version['name']}" == user["apiVersion"]
    schema = strict_schema(version["schema"]["openAPIV3Schema"])
    assert list(jsonschema.Draft7Validator(schema).iter_errors(user)) == []
    broken = kustomize.altered(user, ("spec", "authentication", "type"), "scram-sha-256")
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))
    assert user["spec"]["authentication"] == {"type": "tls"}  # User:CN=svc: a certificate
    granted = {(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"], op)
               for a in user["spec"]["authorization"]["acls"] for op in a["operations"]}
    assert granted == {(kind.lower().replace("_", ""), name, pattern.lower(), op.title())
                       for kind, name, pattern, op in bindings(Settings())}


def test_a_principal_must_be_a_user(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acls", "--principal", "svc"]) == 2
    assert "expected User:NAME" in capsys.readouterr().err


@pytest.mark.parametrize(("principal", "problem"), [
    ("User:*", "the wildcard (every user)"),
    ("User:a\nb", "control or line-break"),
    ("User:a\rUser:b", "control or line-break"),
    ("User:\x1b]52;c;b3duZWQ=\x07", "control or line-break"),
    ("User:a\u202eb", "control or line-break"),
    ("User: ", "expected User:NAME"),
])
def test_a_wildcard_or_unprintable_principal_is_refused(
    principal: str, problem: str, capsys: pytest.CaptureFixture[str],
) -> None:
    for form in ("kafka-acls", "strimzi"):
        assert main(["acls", "--principal", principal, "--format", form]) == 2
        captured = capsys.readouterr()
        assert problem in captured.err and captured.out == ""


@pytest.mark.parametrize("principal", ["User:Assembler", "User:CN=my_app", "User:a..b",
                                       "User:-a", "User:" + "a" * 254, "User:CN=a b"])
def test_a_strimzi_user_kubernetes_would_refuse_is_refused(
    principal: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["acls", "--principal", principal, "--format", "strimzi"]) == 2
    assert "DNS-1123" in capsys.readouterr().err
    assert main(["acls", "--principal", principal]) == 0  # a Kafka principal all the same


def test_a_strimzi_cluster_label_kubernetes_would_refuse_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for cluster in ("a b", "-a", "a" * 64, "x\ny"):
        assert main(["acls", "--principal", "User:a", "--format", "strimzi",
                     f"--strimzi-cluster={cluster}"]) == 2
        assert "is not a label value" in capsys.readouterr().err
    assert main(["acls", "--principal", "User:CN=app.prod", "--format", "strimzi",
                 "--strimzi-cluster", "prod_1.a"]) == 0
    assert 'name: "app.prod"' in capsys.readouterr().out


@pytest.mark.parametrize(("variable", "value"), [
    ("ASSEMBLER_INPUT_TOPIC", "*"), ("ASSEMBLER_DLQ_TOPIC", "*"),
    ("ASSEMBLER_GROUP_ID", "*"), ("ASSEMBLER_TRANSACTIONAL_ID", "*"),
    ("ASSEMBLER_INPUT_TOPIC", "x$(id)"), ("ASSEMBLER_TRANSACTIONAL_ID", ""),
])
def test_acls_never_grants_on_a_wildcard_or_an_invalid_name(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("ASSEMBLER_PROCESSING_GUARANTEE", "exactly_once")
    assert main(["acls", "--principal", "User:a"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and variable in captured.err
