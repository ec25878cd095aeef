"""kubeconform over everything deploy/k8s renders, offline: `make check-kubeconform` runs this,
and with --helm (`make check-helm`) over the Helm chart's renders instead.

Each entry point (base and every overlay) is rendered by tests/deploy/kustomize.py on its own
and with each component it does not already include, as a user's kustomization would add it;
the chart by `helm template` with each set of values in tests/deploy/helm.py.
kubeconform -strict then checks every object, for each Kubernetes version below, against
schemas written here from offline copies (kubeconform cannot download them here):

- built-in kinds: the schemas the `kubernetes-validate` package ships, each made standalone
  (its definitions embedded, as kubeconform resolves no `/api/...` references);
- custom resources: the CRDs vendored in schemas/ (KEDA) and the prometheus-operator shapes in
  schemas/monitoring.coreos.com.json, with unknown fields refused as `kubectl apply` does.

A kind with no schema is an error, never skipped, and the summary must count every object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import helm, kustomize
from tests.deploy.kustomize import Object

SCHEMAS = Path(__file__).resolve().parent / "schemas"
K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
#: Kubernetes versions whose schemas the built-in objects must satisfy.
KUBERNETES_VERSIONS: tuple[str, ...] = ("1.30", "1.33")
#: The built-in kinds' schemas, as the `kubernetes-validate` package (a dev dependency) ships them.
BUILT_IN_SCHEMAS = Path(str(files("kubernetes_validate") / "kubernetes-json-schema"))
#: The prometheus-operator kinds schemas/monitoring.coreos.com.json defines.
MONITORING_KINDS = ("PodMonitor", "PrometheusRule")
#: kubeconform's template variables: where it looks for a kind's schema under the work folder.
BUILT_IN_LOCATION = "{{.NormalizedKubernetesVersion}}/{{.ResourceKind}}{{.KindSuffix}}.json"
CUSTOM_LOCATION = "{{.Group}}/{{.ResourceKind}}_{{.ResourceAPIVersion}}.json"
SUMMARY = re.compile(r"^Summary: (\d+) resources? found .* Valid: (\d+), Invalid: (\d+), "
                     r"Errors: (\d+), Skipped: (\d+)$", re.MULTILINE)


def strict_schema(schema: Any) -> Any:
    """An OpenAPI schema that refuses unknown fields, as `kubectl apply` (strict field
    validation) does, where the CRD lists an object's properties and allows no others."""
    if isinstance(schema, list):
        return [strict_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    strict = {key: strict_schema(value) for key, value in schema.items()}
    if ("properties" in schema and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        strict["additionalProperties"] = False
    return strict


def crd_schemas() -> dict[tuple[str, str, str], Any]:
    """(group, kind, version) -> the strict schema of each CRD vendored in schemas/."""
    found: dict[tuple[str, str, str], Any] = {}
    for path in sorted(SCHEMAS.glob("*.yaml")):
        (crd,) = kustomize.load_yaml(path)
        assert crd["kind"] == "CustomResourceDefinition", f"{path}: not a CRD"
        spec = crd["spec"]
        for version in spec["versions"]:
            key = (spec["group"], spec["names"]["kind"], version["name"])
            found[key] = strict_schema(version["schema"]["openAPIV3Schema"])
    monitoring = json.loads((SCHEMAS / "monitoring.coreos.com.json").read_text(encoding="utf-8"))
    for kind in MONITORING_KINDS:
        found[("monitoring.coreos.com", kind, "v1")] = {**monitoring,
                                                        "$ref": f"#/definitions/{kind}"}
    return found


def kind_suffix(api_version: str) -> str:
    """kubeconform's {{.KindSuffix}}, which is also how kubernetes-validate names its files:
    `apps/v1` -> `-apps-v1`, `rbac.authorization.k8s.io/v1` -> `-rbac-v1`, `v1` -> `-v1`."""
    group, _, version = api_version.rpartition("/")
    return "-" + "-".join(part.split(".")[0].lower() for part in (group, version) if part)


def write_built_in_schemas(objects: Iterable[Object], root: Path) -> None:
    """The kubernetes-validate schema of each built-in kind in `objects`, made standalone, where
    BUILT_IN_LOCATION finds it; a kind it has no schema for gets none (kubeconform says so)."""
    kinds = {(obj["apiVersion"], obj["kind"]) for obj in objects}
    for version in KUBERNETES_VERSIONS:
        source = BUILT_IN_SCHEMAS / f"v{version}.0-local-strict"
        definitions = json.loads((source / "_definitions.json").read_text(encoding="utf-8"))
        target = root / f"v{version}.0"
        target.mkdir(parents=True)
        for api_version, kind in sorted(kinds):
            name = f"{kind.lower()}{kind_suffix(api_version)}.json"
            if not (source / name).is_file():
                continue
            text = (source / name).read_text(encoding="utf-8")
            schema = json.loads(text.replace('"/api/_definitions.json#', '"#'))
            schema["$defs"] = definitions["$defs"]
            (target / name).write_text(json.dumps(schema), encoding="utf-8")


def write_custom_schemas(root: Path) -> None:
    for (group, kind, version), schema in crd_schemas().items():
        path = root / group / f"{kind.lower()}_{version}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(schema), encoding="utf-8")


def entry_points(k8s: Path) -> dict[str, Path]:
    """The kustomizations a user applies: base and every overlay."""
    overlays = sorted(path.parent for path in (k8s / "overlays").glob("*/kustomization.yaml"))
    return {"base": k8s / "base", **{path.name: path for path in overlays}}


def renders(k8s: Path, work: Path) -> dict[str, list[Object]]:
    """Each entry point's objects, alone and with each component it does not name itself
    (through a kustomization under `work` listing both, as a user's would)."""
    components = sorted(path.parent for path in (k8s / "components").glob("*/kustomization.yaml"))
    rendered: dict[str, list[Object]] = {}
    for name, entry in entry_points(k8s).items():
        rendered[name] = kustomize.render(entry)
        named = {(entry / item).resolve()
                 for item in kustomize.kustomization(entry).get("components", [])}
        for component in components:
            if component.resolve() in named:
                continue
            user = work / "kustomizations" / f"{name}+{component.name}"
            user.mkdir(parents=True)
            (user / "kustomization.yaml").write_text(yaml.safe_dump({
                "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                "resources": [os.path.relpath(entry, user)],
                "components": [os.path.relpath(component, user)],
            }), encoding="utf-8")
            rendered[user.name] = kustomize.render(user)
    return rendered


def chart_renders(helm_binary: str, chart: Path) -> dict[str, list[Object]]:
    """The chart's objects with each set of values in helm.CASES."""
    return {f"helm-{name}": helm.render(helm_binary, *args, chart=chart)
            for name, args in helm.CASES.items()}


def check(kubeconform: str, k8s: Path, helm_binary: str | None = None,
          chart: Path = helm.CHART) -> int:
    """Render (the chart with `helm_binary`, else the kustomizations), write the schemas, run
    kubeconform for each version; its exit code (or 1 when its summary does not account for
    every object as valid)."""
    with tempfile.TemporaryDirectory(prefix="kubeconform-") as tmp:
        work = Path(tmp)
        manifests: list[str] = []
        objects: list[Object] = []
        rendered_sets = (chart_renders(helm_binary, chart) if helm_binary is not None
                         else renders(k8s, work))
        for name, rendered in rendered_sets.items():
            path = work / "manifests" / f"{name}.yaml"
            path.parent.mkdir(exist_ok=True)
            path.write_text(yaml.safe_dump_all(rendered, sort_keys=False), encoding="utf-8")
            manifests.append(str(path))
            objects.extend(rendered)
            print(f"{name}: {len(rendered)} objects: "
                  + ", ".join(sorted({obj["kind"] for obj in rendered})))
        write_built_in_schemas(objects, work / "schemas")
        write_custom_schemas(work / "schemas")
        for version in KUBERNETES_VERSIONS:
            print(f"kubeconform -strict, Kubernetes {version}:", flush=True)
            result = subprocess.run(
                [kubeconform, "-strict", "-summary", "-kubernetes-version", f"{version}.0",
                 "-schema-location", str(work / "schemas" / BUILT_IN_LOCATION),
                 "-schema-location", str(work / "schemas" / CUSTOM_LOCATION), *manifests],
                capture_output=True, text=True, check=False, timeout=300,
            )
            print(result.stdout.replace(tmp, "<render>"), end="")
            print(result.stderr, end="", file=sys.stderr)
            if result.returncode != 0:
                return result.returncode
            summary = SUMMARY.search(result.stdout)
            if summary is None or summary.group(1, 2) != (str(len(objects)),) * 2:
                print(f"kubeconform did not report all {len(objects)} objects valid",
                      file=sys.stderr)
                return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--kubeconform", default="kubeconform", help="the kubeconform binary")
    parser.add_argument("--helm", help="the helm binary: check the chart's renders instead")
    parser.add_argument("--chart", type=Path, default=helm.CHART, help="the chart (with --helm)")
    parser.add_argument("k8s", nargs="?", type=Path, default=K8S,
                        help="the folder holding base/, overlays/ and components/")
    args = parser.parse_args(argv)
    return check(args.kubeconform, args.k8s, args.helm, args.chart)


if __name__ == "__main__":
    sys.exit(main())
