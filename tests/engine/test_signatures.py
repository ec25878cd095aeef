"""The engine's state travels as one object (`assembling.Assembling`), not as loose
parameters: no engine function or method takes more than MAX_PARAMETERS."""

from __future__ import annotations

import ast
from pathlib import Path

import context_assembler.engine

ENGINE = Path(context_assembler.engine.__file__).parent
MAX_PARAMETERS = 5  # self and cls not counted; keyword-only, *args and **kwargs counted


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    arguments = function.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
    names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def too_long(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            names = parameters(node)
            if len(names) > MAX_PARAMETERS:
                name = getattr(node, "name", "lambda")
                found.append(f"{filename}:{node.lineno} {name}({', '.join(names)})")
    return found


def test_no_engine_function_takes_more_than_five_parameters() -> None:
    modules = sorted(ENGINE.glob("*.py"))
    assert len(modules) > 10
    found = [line for path in modules for line in too_long(path.read_text("utf-8"), path.name)]
    assert found == [], "pass an object (e.g. Assembling) instead:\n" + "\n".join(found)


def test_the_check_counts_keyword_only_and_starred_parameters_but_not_self() -> None:
    source = (
        "class C:\n"
        "    def method(self, a, b, c, d, e): ...\n"
        "def keywords(a, *, b, c, d, e, f): ...\n"
        "def starred(a, b, c, d, *args, **kwargs): ...\n"
        "fits = lambda a, b, c, d, e: a\n"
    )
    assert [line.split()[1].split("(")[0] for line in too_long(source, "m.py")] == [
        "keywords", "starred"
    ]
