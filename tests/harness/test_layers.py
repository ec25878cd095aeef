"""Who may import whom around the package: the harness (brokers, registry, worker processes)
serves `tests` and `bench`, which import it and never each other; a test of bench code
(tests/bench, tests/chaos) is the one exception. The package imports none of them."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS_OF_BENCH = ("tests/bench/", "tests/chaos/")


def imports(folder: str) -> Iterator[tuple[str, int, str]]:
    """(file, line, top-level name imported) for every absolute import under `folder`, at any
    depth (function-level imports included)."""
    for path in sorted((REPO / folder).rglob("*.py")):
        tree = ast.parse(path.read_text("utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                yield str(path.relative_to(REPO)), node.lineno, name.split(".")[0]


def reaching(folder: str, forbidden: set[str], allowed: tuple[str, ...] = ()) -> list[str]:
    return [f"{file}:{line} imports {name}" for file, line, name in imports(folder)
            if name in forbidden and not file.startswith(allowed)]


def test_the_harness_imports_neither_tests_nor_bench() -> None:
    assert reaching("harness", {"tests", "bench"}) == []


def test_bench_imports_the_harness_never_the_tests() -> None:
    assert reaching("bench", {"tests"}) == []
    assert any(name == "harness" for _, _, name in imports("bench"))


def test_tests_import_bench_only_to_test_it() -> None:
    assert reaching("tests", {"bench"}, TESTS_OF_BENCH) == []
    assert any(file.startswith(TESTS_OF_BENCH) and name == "bench"
               for file, _, name in imports("tests"))  # the walk sees them at all


def test_the_package_imports_none_of_them_and_the_wheel_leaves_them_out() -> None:
    assert reaching("worker", {"tests", "bench", "harness"}) == []
    project = tomllib.loads((REPO / "pyproject.toml").read_text("utf-8"))
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["context_assembler*"]
