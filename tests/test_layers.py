"""The package's layers, checked on the source: every import, module-level or inside a function.

    contract < engine < intake < {filemode, diagnose, observability, settings, the package
    root} < kafka (clients and records) < kafka.tools < kafka.runtime < serve < cli < generate

A module may import from its own room or from a lower layer, never from a higher one nor from
another room of its own layer (filemode and diagnose do not know each other). The engine is a
deterministic core: it imports nothing of the project but itself and the contract. The sensors
(observability) import types, never the transport. No folder imports a folder that imports it
back, and the engine's modules form no circle, not even a type-only one. The writers of the
generated files (generate) sit above everything, so nothing the worker, serve or the CLI runs
imports them; the runtime reads what they wrote.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "worker"
# Each room and its layer; a module belongs to the longest room its name starts with.
ROOMS: dict[str, int] = {
    "context_assembler.contract": 0,
    "context_assembler.engine": 1,
    "context_assembler.intake": 2,
    "context_assembler.filemode": 3,
    "context_assembler.diagnose": 3,
    "context_assembler.observability": 3,  # metrics, traces, logs: shared by kafka and serve
    "context_assembler.settings": 3,  # every command's settings: kafka, serve and cli read them
    "context_assembler": 3,  # the root: the library's public API over the engine and intake
    "context_assembler.kafka": 4,  # what both rooms stand on: clients, records, batches
    "context_assembler.kafka.tools": 5,  # produce, read, replay, redrive, topics: no worker
    "context_assembler.kafka.runtime": 6,  # the worker: loop, delivery, commits, membership
    "context_assembler.serve": 7,  # the HTTP endpoint: the worker's metrics, no Kafka
    "context_assembler.cli": 8,
    "context_assembler.generate": 9,  # schemas/ and docs/settings.md: `make` runs them
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    _module_name(path): path
    for path in sorted((ROOT / "context_assembler").rglob("*.py"))
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
    found = [room for room in ROOMS if module == room or module.startswith(f"{room}.")]
    return max(found, key=len) if found else None


PROJECT_IMPORTS = [
    found for module in MODULES for found in _imports(module) if _room(found.target) is not None
]


def test_every_module_has_a_room() -> None:
    assert [module for module in MODULES if _room(module) is None] == []
    assert len(PROJECT_IMPORTS) > 50  # the walk sees the imports at all


def test_the_engine_imports_nothing_of_the_project_but_itself_and_the_contract() -> None:
    outside = [
        str(found) for found in PROJECT_IMPORTS
        if _room(found.importer) == "context_assembler.engine"
        and _room(found.target) not in ("context_assembler.engine", "context_assembler.contract")
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
    """observability imports nothing of the Kafka shell: types from the contract, the engine
    and the intake only."""
    sensors = "context_assembler.observability"
    transport = [
        str(found) for found in PROJECT_IMPORTS
        if (found.importer == sensors or found.importer.startswith(f"{sensors}."))
        and found.target.startswith("context_assembler.kafka")
    ]
    assert transport == []


def _folder(module: str) -> str:
    return module if _is_package(module) else module.rpartition(".")[0]


def _circles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected parts of a graph with more than one node (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for source, target in edges:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_folder_imports_a_folder_that_imports_it_back() -> None:
    edges = {(_folder(found.importer), _folder(found.target)) for found in PROJECT_IMPORTS
             if found.target in MODULES and _folder(found.importer) != _folder(found.target)}
    assert len(edges) > 10
    assert _circles(edges) == []


def test_the_engines_modules_form_no_circle() -> None:
    engine = "context_assembler.engine"
    edges = {(found.importer, found.target) for found in PROJECT_IMPORTS
             if found.importer.startswith(f"{engine}.") and found.target.startswith(f"{engine}.")
             and found.importer != found.target}
    assert len(edges) > 10
    assert _circles(edges) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]


def test_no_command_loads_a_generator_when_it_starts() -> None:
    """Beyond the source: importing the CLI, the worker, serve and the schema registry's
    client, as they start, loads no writer of the generated files."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "import context_assembler.cli.main, context_assembler.kafka.runtime.worker\n"
             "import context_assembler.serve.app, context_assembler.kafka.schema_registry\n"
             "print(sorted(m for m in sys.modules if m.startswith('context_assembler')"
             " and 'generate' in m.split('.')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip() == "[]"
