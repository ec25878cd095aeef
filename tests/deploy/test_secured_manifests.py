"""The manifests' path to a secured cluster: credentials and certificates from one Secret,
mounted as files where the commented settings in settings.env look for them, and a KEDA
TriggerAuthentication reading the same Secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from context_assembler.settings import Settings, security_problems
from tests.deploy import kustomize

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
SECRET = "context-assembler-kafka"
MOUNT = "/etc/context-assembler/kafka"
#: What KEDA's kafka scaler reads from a TriggerAuthentication (its authParams).
KEDA_KAFKA_AUTH_PARAMS = frozenset(
    {"sasl", "username", "password", "tls", "ca", "cert", "key", "keyPassword", "unsafeSsl",
     "oauthTokenEndpointUri", "scopes", "oauthExtensions"})


def commented_settings() -> list[dict[str, str]]:
    """settings.env's commented security examples, one settings set per protocol."""
    lines = (K8S / "base" / "settings.env").read_text().splitlines()
    pairs = [line.removeprefix("# ").split("=", 1) for line in lines
             if line.startswith("# ASSEMBLER_") and "=" in line]
    sasl = {name: value for name, value in pairs if not name.startswith("ASSEMBLER_SSL_")
            or name == "ASSEMBLER_SSL_CA_FILE"}
    mtls = {"ASSEMBLER_SECURITY_PROTOCOL": "SSL", **{
        name: value for name, value in pairs if name.startswith("ASSEMBLER_SSL_")}}
    return [sasl, mtls]


@pytest.mark.parametrize("entry", [K8S / "base", K8S / "overlays" / "exactly-once"])
def test_every_pod_mounts_the_kafka_secret_read_only_and_optional(entry: Path) -> None:
    objects = kustomize.render(entry)
    pods = [obj for obj in objects if obj["kind"] in {"Deployment", "StatefulSet", "Job"}]
    assert len(pods) == 2
    for pod in pods:
        spec = pod["spec"]["template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == SECRET]
        assert volume["secret"]["optional"] is True  # an unsecured cluster needs no Secret
        (container,) = spec["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["mountPath"] == MOUNT and mount["readOnly"] is True


@pytest.mark.parametrize("variables", commented_settings(), ids=["sasl_ssl", "mtls"])
def test_the_commented_security_settings_are_coherent_and_read_the_mounted_secret(
    variables: dict[str, str],
) -> None:
    fields = {name.removeprefix("ASSEMBLER_").lower(): value for name, value in variables.items()}
    assert set(fields) <= set(Settings.model_fields)
    settings = Settings.model_construct(**{**Settings().model_dump(), **fields})
    assert security_problems(settings) == []
    files = [value for name, value in fields.items() if name.endswith("_file")]
    assert files and all(Path(value).parent == Path(MOUNT) for value in files)


def test_keda_authenticates_from_the_same_secret() -> None:
    objects = kustomize.render(K8S / "base")
    (auth,) = [obj for obj in objects if obj["kind"] == "TriggerAuthentication"]
    assert auth["apiVersion"] == "keda.sh/v1alpha1"
    refs = auth["spec"]["secretTargetRef"]
    assert {ref["name"] for ref in refs} == {SECRET}
    assert {ref["parameter"] for ref in refs} <= KEDA_KAFKA_AUTH_PARAMS
    keys = {ref["parameter"]: ref["key"] for ref in refs}
    sasl, _ = commented_settings()
    assert sasl["ASSEMBLER_SASL_PASSWORD_FILE"] == f"{MOUNT}/{keys['password']}"
    assert sasl["ASSEMBLER_SSL_CA_FILE"] == f"{MOUNT}/{keys['ca']}"
    scaled = (K8S / "base" / "keda-scaledobject.yaml").read_text()
    assert f"#   name: {auth['metadata']['name']}" in scaled  # the reference to uncomment
