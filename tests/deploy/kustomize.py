"""The subset of kustomize that deploy/k8s uses, so the tests read the objects `kubectl apply -k`
would apply without needing the kustomize binary: resources (files and directories),
configMapGenerator (files, envs), generatorOptions labels, components (images, resource files,
patches), images, and patches that delete an object or JSON-patch one. Anything else in a kustomization fails the render, and
`test_manifests` compares this render with `kubectl kustomize` wherever kubectl is installed.

Generated ConfigMaps keep their plain names here; kustomize appends a hash of their content
(`normalise` takes it off kustomize's output for comparison).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Object = dict[str, Any]
KNOWN_FIELDS = frozenset(
    {"apiVersion", "kind", "resources", "components", "configMapGenerator", "generatorOptions",
     "images", "patches"}
)


def load_yaml(path: Path) -> list[Object]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]
    for doc in docs:
        assert isinstance(doc, dict), f"{path}: a document is not a mapping"
    return docs


def kustomization(directory: Path) -> Object:
    (doc,) = load_yaml(directory / "kustomization.yaml")
    unknown = set(doc) - KNOWN_FIELDS
    assert not unknown, f"{directory}: fields this renderer does not know: {sorted(unknown)}"
    return doc


def parse_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as kustomize's `envs` reads them: blank lines and # comments skipped."""
    pairs: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        assert sep and key, f"{path}:{number}: expected KEY=VALUE"
        assert key not in pairs, f"{path}:{number}: {key} is set twice"
        pairs[key] = value
    return pairs


def identity(obj: Object) -> tuple[str, str]:
    return str(obj["kind"]), str(obj["metadata"]["name"])


def render(directory: Path) -> list[Object]:
    doc = kustomization(directory)
    objects: list[Object] = []
    for entry in doc.get("resources", []):
        path = directory / entry
        assert path.exists(), f"{directory}: resource {entry} does not exist"
        objects.extend(render(path) if path.is_dir() else load_yaml(path))
    labels = doc.get("generatorOptions", {}).get("labels", {})
    for generator in doc.get("configMapGenerator", []):
        data: dict[str, str] = {}
        for name in generator.get("files", []):
            data[Path(name).name] = (directory / name).read_text(encoding="utf-8")
        for name in generator.get("envs", []):
            data.update(parse_env_file(directory / name))
        metadata: Object = {"name": generator["name"]}
        if labels:
            metadata["labels"] = dict(labels)
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                        "data": data})
    for patch in doc.get("patches", []):
        objects = _apply_patch(objects, patch, directory)
    images = list(doc.get("images", []))
    for entry in doc.get("components", []):
        component = kustomization(directory / entry)
        assert component["kind"] == "Component", f"{entry} is not a Component"
        assert set(component) <= {"apiVersion", "kind", "images", "resources", "patches"}, (
            f"{entry}: only images, resource files and patches"
        )
        images.extend(component.get("images", []))
        for name in component.get("resources", []):
            assert (directory / entry / name).is_file(), f"{entry}: resource {name} is not a file"
            objects.extend(load_yaml(directory / entry / name))
        for patch in component.get("patches", []):
            objects = _apply_patch(objects, patch, directory / entry)
    for image in images:
        for container in containers(objects):
            name = re.split(r"[:@]", container["image"], maxsplit=1)[0]
            if name == image["name"]:
                container["image"] = f"{image.get('newName', name)}:{image['newTag']}"
    keys = [identity(obj) for obj in objects]
    assert len(keys) == len(set(keys)), f"{directory}: an object occurs twice: {keys}"
    return objects


def _apply_patch(objects: list[Object], patch: Object, directory: Path) -> list[Object]:
    assert set(patch) <= {"patch", "target"}, f"{directory}: patch form {sorted(patch)}"
    body = yaml.safe_load(patch["patch"])
    if "target" not in patch:
        assert isinstance(body, dict) and body.get("$patch") == "delete", (
            f"{directory}: only `$patch: delete` strategic merge patches are supported"
        )
        victim = identity(body)
        assert victim in {identity(obj) for obj in objects}, f"{directory}: no {victim} to delete"
        return [obj for obj in objects if identity(obj) != victim]
    target = patch["target"]
    matched = [obj for obj in objects if identity(obj) == (target["kind"], target["name"])
               and obj["apiVersion"].split("/")[0] == target.get("group", obj["apiVersion"])]
    assert matched, f"{directory}: patch target {target} matches nothing"
    for obj in matched:
        for operation in body:
            assert operation["op"] == "replace", f"{directory}: op {operation['op']}"
            *parents, last = operation["path"].strip("/").split("/")
            node = obj
            for part in parents:
                node = node[part]
            assert last in node, f"{directory}: {operation['path']} does not exist to replace"
            node[last] = copy.deepcopy(operation["value"])
    return objects


def altered(obj: Object, path: tuple[str | int, ...], value: object) -> Object:
    """A deep copy of `obj` with the field at `path` set to `value` (None: removed), to show
    that a schema refuses it."""
    copied: Object = copy.deepcopy(obj)
    node: Any = copied
    for part in path[:-1]:
        node = node[part]
    if value is None:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return copied


def pod_specs(objects: list[Object]) -> Iterator[Object]:
    for obj in objects:
        template = obj.get("spec", {}).get("template")
        if isinstance(template, dict):
            yield template["spec"]


def containers(objects: list[Object]) -> Iterator[Object]:
    for spec in pod_specs(objects):
        yield from spec.get("initContainers", [])
        yield from spec["containers"]


def normalise(objects: list[Object], generated: set[str]) -> list[Object]:
    """`objects` with kustomize's hash suffix taken off the names of the generated ConfigMaps."""
    suffix = re.compile(r"\b(" + "|".join(map(re.escape, sorted(generated))) + r")-[a-z0-9]{10}\b")
    text = yaml.safe_dump_all(objects, sort_keys=True)
    return [doc for doc in yaml.safe_load_all(suffix.sub(r"\1", text)) if doc is not None]
