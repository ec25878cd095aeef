"""deploy/Dockerfile, .dockerignore and the packaging the image relies on.

No Docker engine is needed: the Dockerfile is parsed, its own commands are run where they
can be (the dependency list it extracts, the HEALTHCHECK against a throwaway HTTP server),
and the pins it installs from are checked against the project's installed metadata.
"""

from __future__ import annotations

import fnmatch
import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from context_assembler.cli.main import main
from tests.factories import EXAMPLES

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
CONSOLE_SCRIPT = "context-assembler"
HTTP_PORT = 8080  # the manifests' ASSEMBLER_HTTP_PORT (tests/deploy/test_manifests.py)
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


@dataclass
class Stage:
    """One FROM ... stage of a Dockerfile: its base image and its instructions."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, keyword: str) -> list[str]:
        return [rest for kw, rest in self.instructions if kw == keyword]


def _dockerfile_lines(text: str) -> Iterator[tuple[str, str]]:
    """Yield (INSTRUCTION, arguments) with continuations joined and comments dropped."""
    buffer = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        logical = (buffer + stripped).strip()
        buffer = ""
        keyword, _, rest = logical.partition(" ")
        yield keyword.upper(), rest.strip()
    assert not buffer, "Dockerfile ends inside a line continuation"


def _parse_dockerfile(text: str) -> list[Stage]:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in _dockerfile_lines(text):
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--platform")]
            image = re.sub(
                r"\$\{?(\w+)\}?", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=image, name=name))
        elif not stages:
            assert keyword == "ARG", f"only ARG may precede the first FROM, found {keyword}"
            arg_name, _, default = rest.partition("=")
            global_args[arg_name] = default
        else:
            stages[-1].instructions.append((keyword, rest))
    return stages


def _dockerfile_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in stage.args("ENV"):
        for word in shlex.split(rest):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def _exec_form(rest: str, where: str) -> list[str]:
    assert rest.startswith("["), f"{where} must use the exec (JSON array) form: {rest}"
    parsed = json.loads(rest)
    assert isinstance(parsed, list) and all(isinstance(item, str) for item in parsed), where
    return parsed


def _run_commands(stage: Stage) -> list[str]:
    """Each shell command of the stage's RUN lines (split at &&), mount flags dropped."""
    commands: list[str] = []
    for rest in stage.args("RUN"):
        rest = re.sub(r"^(--\S+\s+)+", "", rest)
        commands.extend(part.strip() for part in rest.split("&&"))
    return commands


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return _parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def build_stage(stages: list[Stage]) -> Stage:
    return stages[0]


@pytest.fixture(scope="module")
def final_stage(stages: list[Stage]) -> Stage:
    return stages[-1]


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_builds_a_non_root_worker_image(stages: list[Stage], final_stage: Stage) -> None:
    assert len(stages) >= 2, "multi-stage build expected"
    users = final_stage.args("USER")
    assert users, "the runtime stage must switch to a non-root USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "use a numeric non-root uid (runAsNonRoot needs it)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    assert _exec_form(final_stage.args("ENTRYPOINT")[-1], "ENTRYPOINT") == [CONSOLE_SCRIPT]
    assert _exec_form(final_stage.args("CMD")[-1], "CMD") == ["worker"]
    exposed = {p.split("/")[0] for rest in final_stage.args("EXPOSE") for p in rest.split()}
    assert str(HTTP_PORT) in exposed
    env = _dockerfile_env(final_stage)
    assert env.get("PYTHONUNBUFFERED") == "1"
    assert env.get("ASSEMBLER_HTTP_PORT", "8080") == str(HTTP_PORT)
    assert env.get("ASSEMBLER_HTTP_HOST") == "0.0.0.0", "the worker binds 127.0.0.1 by default"
    assert CONSOLE_SCRIPT in PYPROJECT["project"]["scripts"], "ENTRYPOINT names no console script"
    assert not final_stage.args("RUN") or all("pip install" not in c
                                              for c in _run_commands(final_stage))


def test_the_base_image_is_pinned_by_version_and_digest(stages: list[Stage]) -> None:
    bases = {stage.base for stage in stages}
    assert len(bases) == 1, "the venv built in one stage runs in the other: same base"
    (base,) = bases
    match = re.fullmatch(r"python:(\d+\.\d+)\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base)
    assert match, f"{base}: pin a patch version, the Debian release and the digest"
    assert PYPROJECT["project"]["requires-python"] == f">={match.group(1)}"


def test_dependencies_are_installed_from_constraints_before_the_code(build_stage: Stage) -> None:
    copies = [(i, rest) for i, (kw, rest) in enumerate(build_stage.instructions) if kw == "COPY"]
    runs = [(i, rest) for i, (kw, rest) in enumerate(build_stage.instructions) if kw == "RUN"]
    first_code = min(i for i, rest in copies if rest.split()[0] in {"worker"})
    deps_copy = min(i for i, rest in copies if "constraints.txt" in rest.split())
    assert set(build_stage.instructions[deps_copy][1].split()[:-1]) == {
        "pyproject.toml", "constraints.txt"}, "the dependency layer depends on these two only"
    deps_run = min(i for i, rest in runs if "-r requirements.txt" in rest)
    assert deps_copy < deps_run < first_code, "dependencies first: code edits keep their layer"
    installs = [c for c in _run_commands(build_stage) if c.startswith("pip install")]
    assert installs
    for command in installs:
        assert "-c constraints.txt" in command, f"unpinned: {command}"
    (project,) = (c for c in installs if c.endswith(" ."))
    assert "--no-deps" in project and "--build-constraint constraints.txt" in project
    assert "pip check" in _run_commands(build_stage)


def test_the_image_installs_the_runtime_dependencies_only(
    build_stage: Stage, tmp_path: Path
) -> None:
    """Run the Dockerfile's own extraction on pyproject.toml: no charts, no dev tools."""
    (extract,) = (c for c in _run_commands(build_stage) if "requirements.txt" in c
                  and c.startswith("python -c"))
    command, redirect, target = extract.partition(">")
    assert redirect and target.strip().split()[0] == "requirements.txt"
    (tmp_path / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes())
    argv = shlex.split(command)
    environment = {name: value for name, value in os.environ.items() if name != "EXTRAS"}
    result = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=True, env=environment)
    assert result.stdout.splitlines() == PYPROJECT["project"]["dependencies"]
    names = {canonicalize_name(Requirement(line).name) for line in result.stdout.splitlines()}
    assert "matplotlib" not in names
    # --build-arg EXTRAS=msk-iam (a build argument is a RUN's environment variable).
    assert "EXTRAS" in build_stage.args("ARG")[0]
    result = subprocess.run([sys.executable, *argv[1:]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, check=True,
                            env={**environment, "EXTRAS": "msk-iam"})
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert result.stdout.splitlines() == [*PYPROJECT["project"]["dependencies"],
                                          *extras["msk-iam"]]


def test_dockerfile_copies_only_existing_paths(stages: list[Stage]) -> None:
    for stage in stages:
        for rest in stage.args("COPY"):
            words = rest.split()
            if any(w.startswith("--from") for w in words):
                continue
            for source in (w for w in words[:-1] if not w.startswith("--")):
                assert (REPO / source).exists(), f"COPY {source}: not in the build context"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `path` (relative, /-separated) out of the build context."""
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        hit = any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes) or (
            pattern.startswith("**/")
            and any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts)
        )
        if hit:
            excluded = not negate
    return excluded


def test_dockerignore_keeps_the_build_context_small(stages: list[Stage]) -> None:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for heavy in (".venv", ".git", "out", ".kafka", ".mypy_cache", ".pytest_cache",
                  ".ruff_cache", "worker/__pycache__", "context_assembler.egg-info"):
        assert _ignored(heavy, patterns), f"{heavy} would be sent to the builder"
    for stage in stages:
        for rest in stage.args("COPY"):
            words = rest.split()
            if any(w.startswith("--from") for w in words):
                continue
            for source in (w for w in words[:-1] if not w.startswith("--")):
                assert not _ignored(source, patterns), f"COPY {source} is ignored"
                for path in (REPO / source).rglob("*.py") if (REPO / source).is_dir() else ():
                    relative = path.relative_to(REPO).as_posix()
                    assert not _ignored(relative, patterns), f"{relative} is ignored"


def _healthcheck_argv(stage: Stage) -> list[str]:
    checks = stage.args("HEALTHCHECK")
    assert checks, "the runtime stage needs a HEALTHCHECK"
    _, sep, command = checks[-1].partition("CMD ")
    assert sep, "HEALTHCHECK must use CMD"
    argv = _exec_form(command.strip(), "HEALTHCHECK CMD")
    assert argv[0] == "python", "slim has no curl: the healthcheck runs python"
    return [sys.executable, *argv[1:]]


@contextmanager
def _http_server(status: int) -> Iterator[int]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_dockerfile_healthcheck_probes_health(
    final_stage: Stage, status: int, healthy: bool
) -> None:
    argv = _healthcheck_argv(final_stage)
    assert "/health" in " ".join(argv)
    with _http_server(status) as port:
        env = {**os.environ, "ASSEMBLER_HTTP_PORT": str(port)}
        result = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
    assert (result.returncode == 0) is healthy, result.stderr.decode(errors="replace")


# --------------------------------------------------------------------------- packaging


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version.strip()
    return pins


def _assert_pinned(requirements: list[str]) -> set[str]:
    """Every package `requirements` pull in (for this interpreter) has its pin in
    constraints.txt, the version installed here; their names."""
    pins = _pins()
    seen: set[str] = set()
    todo = [(Requirement(line), {""}) for line in requirements]
    while todo:
        requirement, extras = todo.pop()  # extras: those of the requirement that named it
        name = canonicalize_name(requirement.name)
        marker = requirement.marker
        if name in seen or (marker and not any(marker.evaluate({"extra": e}) for e in extras)):
            continue
        seen.add(name)
        assert name in pins, f"{name} (runtime) has no pin in constraints.txt"
        installed = metadata.version(requirement.name)
        assert pins[name] == installed, f"{name}: pinned {pins[name]}, tested with {installed}"
        todo.extend((Requirement(r), {"", *requirement.extras})
                    for r in metadata.requires(requirement.name) or ())
    return seen


def test_every_runtime_dependency_is_pinned_in_constraints() -> None:
    """The image installs [project].dependencies under constraints.txt: every package that
    pulls in (for this interpreter) must have its pin, or the image gets whatever is newest."""
    seen = _assert_pinned(PYPROJECT["project"]["dependencies"])
    assert "cramjam" in seen, "aiokafka's codec extras (snappy, lz4, zstd) are installed"
    assert {"pip", "setuptools"} <= set(_pins()), "the image's pip and build backend are pinned"


def test_the_msk_iam_extra_is_pinned_and_in_dev() -> None:
    """AWS's signer and what it pulls in (boto3, botocore) are pinned like the runtime, and
    dev installs them, so its tests run."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    seen = _assert_pinned(extras["msk-iam"])
    assert {"aws-msk-iam-sasl-signer-python", "boto3", "botocore"} <= seen
    assert Requirement("context-assembler[msk-iam]") in {Requirement(r) for r in extras["dev"]}


def test_matplotlib_is_the_charts_extra_which_dev_includes() -> None:
    project = PYPROJECT["project"]
    names = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert "matplotlib" not in names, "the worker image has no use for matplotlib"
    extras = project["optional-dependencies"]
    assert {canonicalize_name(Requirement(r).name) for r in extras["charts"]} == {"matplotlib"}
    assert Requirement(f"{project['name']}[charts]") in {Requirement(r) for r in extras["dev"]}


def test_sweep_png_without_matplotlib_says_how_to_install_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises
    png = tmp_path / "sweep.png"
    status = main(["sweep", "q30-staff", "--events", str(EXAMPLES / "events.jsonl"),
                   "--policy", "estimated", "--png", str(png)])
    assert status == 2
    err = capsys.readouterr().err
    assert "pip install -e '.[charts]'" in err
    assert "context-assembler[charts]" not in err, "a name on the package index anyone may take"
    assert not png.exists()
