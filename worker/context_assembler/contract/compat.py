"""Is a JSON Schema a compatible successor of another, within one schema_version?

Replay reads events that are months old, and other services read our outputs with the models
of the day they were built, so within a schema_version:

- an input schema may only widen: every event the old schema accepted, the new one accepts
  (no newly required field, no removed property, no narrowed type, enum or bound);
- an output schema may only narrow: everything the new schema can produce, the old one
  promised (no removed or no-longer-required field, no widened type, enum or bound). New
  output fields are allowed: readers must ignore fields they do not know.

Both are one check, "outer accepts all that inner accepts", with the roles swapped: for an
input the new schema is outer, for an output the old one. It understands what the pydantic
models generate: properties, required, additionalProperties, type, enum and const, anyOf
and oneOf, items, $ref into $defs, and the usual bounds, pattern and format.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

Direction = Literal["input", "output"]
Schema = dict[str, Any]

_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_EXACT = ("pattern", "format")
_OBJECT_KEYS = ("properties", "required", "additionalProperties")


@dataclass(frozen=True)
class _Side:
    root: Schema
    name: str  # "old" or "new", for messages

    def resolve(self, node: Schema) -> tuple[Schema, str | None]:
        """`node` with its $ref followed (only local refs: #/$defs/...), and the ref."""
        ref = node.get("$ref")
        if ref is None:
            return node, None
        target: Any = self.root
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return target, ref


def breaking_changes(old: Schema, new: Schema, direction: Direction) -> list[str]:
    """Every way `new` breaks the readers of `old`, one line each; [] when compatible."""
    checker = _Checker(_Side(old, "old"), _Side(new, "new"), direction)
    outer, inner = (new, old) if direction == "input" else (old, new)
    return list(dict.fromkeys(checker.covers(outer, inner, "")))


class _Checker:
    def __init__(self, old: _Side, new: _Side, direction: Direction) -> None:
        self.direction = direction
        self.outer, self.inner = (new, old) if direction == "input" else (old, new)
        self._done: dict[tuple[str, str], list[str]] = {}  # per pair of definitions

    def covers(self, outer: Schema, inner: Schema, path: str) -> list[str]:
        """What `inner` allows that `outer` does not (at `path`)."""
        outer, outer_ref = self.outer.resolve(outer)
        inner, inner_ref = self.inner.resolve(inner)
        if outer_ref is None or inner_ref is None:
            return self._compare(outer, inner, path)
        pair = (outer_ref, inner_ref)
        if pair not in self._done:  # each pair once; [] while a recursive one is in progress
            self._done[pair] = []
            self._done[pair] = self._compare(outer, inner, path)
        return self._done[pair]

    def _compare(self, outer: Schema, inner: Schema, path: str) -> list[str]:
        outer_branches, inner_branches = _branches(outer), _branches(inner)
        if len(outer_branches) > 1 or len(inner_branches) > 1:
            return self._union(outer_branches, inner_branches, path)
        return self._node(outer, inner, path)

    def _union(self, outers: list[Schema], inners: list[Schema], path: str) -> list[str]:
        problems: list[str] = []
        for inner in inners:
            tries = [self.covers(outer, inner, path) for outer in outers]
            if all(tries):
                nearest: list[str] = min(tries, key=len)
                problems.extend(nearest)
        return problems

    def _node(self, outer: Schema, inner: Schema, path: str) -> list[str]:
        where = path or "<root>"
        problems = self._types(outer, inner, where)
        if problems:  # values of another type: their bounds and fields say nothing more
            return problems
        problems += self._values(outer, inner, where)
        problems += self._bounds(outer, inner, where)
        if any(key in node for node in (outer, inner) for key in _OBJECT_KEYS):
            problems += self._object(outer, inner, path)
        if isinstance(outer.get("items"), dict) and isinstance(inner.get("items"), dict):
            problems += self.covers(outer["items"], inner["items"], f"{path}[]")
        return problems

    def _widened_or_narrowed(self) -> str:
        return "narrowed" if self.direction == "input" else "widened"

    def _types(self, outer: Schema, inner: Schema, where: str) -> list[str]:
        outer_types, inner_types = _types(outer), _types(inner)
        if outer_types is None:
            return []
        extra = (inner_types or {"any"}) - outer_types
        if "integer" in extra and "number" in outer_types:
            extra.discard("integer")
        if not extra:
            return []
        return [f"{where}: type {self._widened_or_narrowed()}: {self.inner.name} allows "
                f"{sorted(extra)}, {self.outer.name} only {sorted(outer_types)}"]

    def _values(self, outer: Schema, inner: Schema, where: str) -> list[str]:
        outer_values, inner_values = _values(outer), _values(inner)
        if outer_values is None:
            return []
        if inner_values is None:
            return [f"{where}: values {self._widened_or_narrowed()}: {self.outer.name} allows "
                    f"only {outer_values!r}"]
        extra = [value for value in inner_values if value not in outer_values]
        if not extra:
            return []
        return [f"{where}: values {self._widened_or_narrowed()}: {self.inner.name} allows "
                f"{extra!r}, {self.outer.name} does not"]

    def _bounds(self, outer: Schema, inner: Schema, where: str) -> list[str]:
        problems = []
        for key in _LOWER_BOUNDS + _UPPER_BOUNDS:
            if key not in outer:
                continue
            default = -math.inf if key in _LOWER_BOUNDS else math.inf
            inner_bound = inner.get(key, default)
            looser = inner_bound < outer[key] if key in _LOWER_BOUNDS else inner_bound > outer[key]
            if looser:
                problems.append(f"{where}: {key} {self._widened_or_narrowed()}: "
                                f"{self.outer.name} {outer[key]}, {self.inner.name} "
                                f"{inner.get(key, 'none')}")
        problems += [
            f"{where}: {key} changed: {inner.get(key)!r} -> {outer[key]!r}"
            for key in _EXACT if key in outer and inner.get(key) != outer[key]
        ]
        return problems

    def _object(self, outer: Schema, inner: Schema, path: str) -> list[str]:
        prefix = f"{path}." if path else ""
        outer_props: Schema = outer.get("properties", {})
        inner_props: Schema = inner.get("properties", {})
        problems = [
            f"{prefix}{name}: required by {self.outer.name}, not by {self.inner.name}"
            for name in sorted(set(outer.get("required", [])) - set(inner.get("required", [])))
        ]
        if self.direction == "input":
            # A property old events may hold must still be accepted.
            closed = outer.get("additionalProperties", True) is False
            problems += [f"{prefix}{name}: property removed: old events holding it are rejected"
                         for name in sorted(set(inner_props) - set(outer_props)) if closed]
            if closed and inner.get("additionalProperties", True) is not False:
                problems.append(f"{path or '<root>'}: additional properties no longer allowed")
        else:
            # A field old readers may read must still be there (new fields are allowed).
            problems += [f"{prefix}{name}: field removed" for name in sorted(outer_props)
                         if name not in inner_props]
        for name in sorted(set(outer_props) & set(inner_props)):
            problems += self.covers(outer_props[name], inner_props[name], f"{prefix}{name}")
        return problems


def _branches(node: Schema) -> list[Schema]:
    for key in ("anyOf", "oneOf"):
        if key in node:
            branches: list[Schema] = node[key]
            return branches
    return [node]


def _types(node: Schema) -> set[str] | None:
    """The JSON types `node` allows; None for any."""
    if "type" in node:
        declared = node["type"]
        return {declared} if isinstance(declared, str) else set(declared)
    values = _values(node)
    if values is not None:
        return {_json_type(value) for value in values}
    return None


def _values(node: Schema) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    enum: list[Any] | None = node.get("enum")
    return enum


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"
