"""The package's layers, checked on the source: every import, module-level or inside a function.

    schemas < worker.engine < worker.intake < {worker.filemode, worker.diagnose} < worker.kafka
    < worker.serve < worker.cli

A module may import from its own room or from a lower layer, never from a higher one nor from
another room of its own layer (filemode and diagnose do not know each other). The engine is a
pure core: it imports nothing of the project but itself and `schemas`. The Kafka worker's
sensors (observability) import types, never the transport: of the worker only its settings.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Each room and its layer; a module belongs to the longest room its name starts with.
ROOMS: dict[str, int] = {
    "schemas": 0,
    "worker.engine": 1,
    "worker.intake": 2,
    "worker.filemode": 3,
    "worker.diagnose": 3,
    "worker.kafka": 4,
    "worker.serve": 5,  # the HTTP endpoint: the worker's metrics, no Kafka
    "worker.cli": 6,
}
# The package root only re-exports the engine's version: it lives in the engine's room.
ALIASES = {"worker": "worker.engine"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    _module_name(path): path
    for folder in ("worker", "schemas")
    for path in sorted((ROOT / folder).rglob("*.py"))
}


@dataclass(frozen=True)
class Import:
    importer: str
    target: str  # the module imported (for `from m import name`: m.name if that is a module)
    line: int

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.target}"


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str) -> Iterator[Import]:
    """Every import in `module`, at any depth (function-level, lazy imports included)."""
    tree = ast.parse(MODULES[module].read_text("utf-8"), str(MODULES[module]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the importer's package
                package = module if _is_package(module) else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield Import(module, candidate if candidate in MODULES else base, node.lineno)


def _room(module: str) -> str | None:
    """The room of a project module, None for anything else (the standard library, a
    dependency)."""
    module = ALIASES.get(module, module)
    found = [room for room in ROOMS if module == room or module.startswith(f"{room}.")]
    return max(found, key=len) if found else None


PROJECT_IMPORTS = [
    found for module in MODULES for found in _imports(module) if _room(found.target) is not None
]


def test_every_module_has_a_room() -> None:
    assert [module for module in MODULES if _room(module) is None] == []
    assert len(PROJECT_IMPORTS) > 50  # the walk sees the imports at all


def test_the_engine_imports_nothing_of_the_project_but_itself_and_schemas() -> None:
    outside = [
        str(found) for found in PROJECT_IMPORTS
        if _room(found.importer) == "worker.engine"
        and _room(found.target) not in ("worker.engine", "schemas")
    ]
    assert outside == []


def test_no_import_runs_from_a_lower_layer_up_nor_across_one_layer() -> None:
    wrong = []
    for found in PROJECT_IMPORTS:
        importer, target = _room(found.importer), _room(found.target)
        assert importer is not None and target is not None
        if ROOMS[target] > ROOMS[importer] or (ROOMS[target] == ROOMS[importer]
                                               and target != importer):
            wrong.append(f"{found}: {importer} (layer {ROOMS[importer]}) -> {target} "
                         f"(layer {ROOMS[target]})")
    assert wrong == []


def test_the_workers_sensors_import_types_never_the_transport() -> None:
    """Part (c) of the re-layout, the Kafka side's: worker.kafka.observability imports
    nothing of worker.kafka but its settings (types from schemas, the engine, the intake)."""
    sensors = "worker.kafka.observability"
    transport = [
        str(found) for found in PROJECT_IMPORTS
        if (found.importer == sensors or found.importer.startswith(f"{sensors}."))
        and found.target.startswith("worker.kafka")
        and not (found.target == sensors or found.target.startswith(f"{sensors}."))
        and found.target != "worker.kafka.settings"
    ]
    assert transport == []
