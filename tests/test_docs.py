"""The user documentation (README.md, SECURITY.md, docs/) stays true and stays for users.

Every shell block it shows is run as a reader pastes it (tests/test_readme_blocks.py, and
tests/integration/test_first_run.py on the broker), its shown output compared, or is a command
that needs what no test machine has (a cluster, a Docker engine, minutes of benchmark) and is
checked another way; the tests it cites exist; it holds no internal references; and the site
builds strictly.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.doc_blocks import (
    Command,
    broker_session,
    commands,
    runnable_blocks,
    shows,
)
from tests.support.docs import REPO, Block, fenced_blocks, user_documents

CITED = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")
USER_DOCS = [*user_documents(), "SECURITY.md"]

# Shell blocks no test machine can run as shown, and the test that checks what they act on.
CHECKED: dict[tuple[str, str], tuple[str, str]] = {
    ("docs/schema-registry.md", "## Try it"): (
        "tests/integration/test_schema_registry.py::test_the_pages_try_it_block_runs_as_written",
        "needs Java 21 and half a minute for the registry: that Kafka-marked test runs the "
        "block as written"),
    ("docs/deploy.md", "### 1. Build and push the image"): (
        "tests/deploy/test_image.py",
        "needs a Docker engine and a registry: the Dockerfile's stages, pins and context are "
        "checked offline"),
    ("docs/deploy.md", "### 3. Install KEDA"): (
        "tests/deploy/test_manifests.py::test_scaled_object_matches_kedas_crd",
        "needs a cluster: the ScaledObject is validated against KEDA's CRD"),
    ("docs/deploy.md", "### 4. Choose a guarantee and apply"): (
        "tests/deploy/test_manifests.py::test_builtin_objects_match_kubernetes_schemas",
        "needs a cluster: both entry points are rendered and validated against the "
        "Kubernetes schemas"),
    ("docs/secured-cluster.md", "## Settings"): (
        "tests/integration/test_secured.py::test_the_cli_reads_the_same_settings",
        "needs a secured cluster: the tests' broker has a SASL_SSL listener read with these "
        "settings"),
    ("docs/deploy.md", "### Render the chart"): (
        "tests/deploy/test_deploy_docs.py::"
        "test_the_render_block_lints_and_renders_the_exactly_once_chart",
        "needs helm, which `make check-helm` builds in minutes (CI before the tests): that "
        "test runs the block as written once it is built"),
    ("docs/deploy.md", "### Install"): (
        "tests/deploy/test_helm.py::test_the_chart_renders_what_kustomize_renders",
        "needs a cluster: the chart's renders are compared with kustomize's and validated "
        "with kubeconform"),
    ("docs/secured-cluster.md", "## Amazon MSK with IAM"): (
        "tests/kafka/test_msk_iam.py::test_the_settings_select_the_provider_for_every_client",
        "needs an MSK cluster: the settings select AWS's signer, whose token is checked "
        "offline"),
    ("docs/secured-cluster.md", "## Kubernetes"): (
        "tests/deploy/test_secured_manifests.py::"
        "test_every_pod_mounts_the_kafka_secret_read_only_and_optional",
        "needs a cluster: the pods mount the Secret it creates"),
    ("docs/operations.md", "## Faults on a replicated cluster"): (
        "tests/harness/test_cli.py",
        "starts three brokers (CI runs them in `make chaos`); the harness's bookkeeping is "
        "tested without a JVM"),
    ("docs/performance.md", "## The engine"): (
        "tests/test_docs.py::test_the_benchmark_commands_name_real_targets_and_flags",
        "benchmarks take minutes: their targets and flags are checked"),
    ("docs/performance.md", "## The Kafka worker"): (
        "tests/test_docs.py::test_the_benchmark_commands_name_real_targets_and_flags",
        "benchmarks take minutes: their targets and flags are checked"),
    ("docs/quality.md", "## Reproduce the table"): (
        "tests/test_docs.py::test_the_benchmark_commands_name_real_targets_and_flags",
        "benchmarks take minutes: their targets and flags are checked"),
    ("docs/performance.md", "## The HTTP endpoint"): (
        "tests/test_docs.py::test_the_benchmark_commands_name_real_targets_and_flags",
        "benchmarks take minutes: their targets and flags are checked"),
}

# What a user never needs to read: the project's issue numbers, commit hashes, and the
# project's own names for the write-ups its presets reproduce.
INTERNAL_REFERENCES = {
    "issue number": re.compile(r"\bissues?\s+#?\d+|(?<![\w&#/])#\d+\b", re.IGNORECASE),
    "commit hash": re.compile(r"\b(?:[0-9a-f]{40}|(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12})\b"),
    "seed number": re.compile(r"\bseeds?\s+\d{3}", re.IGNORECASE),
}
KIP = re.compile(r"KIP-(\d+)")


def shell_blocks() -> list[Block]:
    return [block for document in user_documents() for block in fenced_blocks(document)
            if block.is_shell]


def cited_test_exists(test_id: str) -> bool:
    path, _, name = test_id.partition("::")
    source = REPO / path
    return source.is_file() and (not name or re.search(
        rf"^(async )?def {name}\b", source.read_text("utf-8"), re.MULTILINE) is not None)


@pytest.mark.parametrize("document", [*USER_DOCS, "bench/README.md"])
def test_every_test_a_document_cites_exists(document: str) -> None:
    missing = [f"{path}::{name}" if name else path
               for path, name in sorted(set(CITED.findall((REPO / document).read_text("utf-8"))))
               if not cited_test_exists(f"{path}::{name}" if name else path)]
    assert not missing, f"{document} cites tests that do not exist: {missing}"


def test_every_fenced_block_says_what_it_holds() -> None:
    """A shell block cannot pass for output: every fence names its language."""
    untagged = [(b.document, b.heading) for d in user_documents() for b in fenced_blocks(d)
                if not b.language]
    assert not untagged


def test_every_section_checked_another_way_still_has_its_shell_block() -> None:
    """Every other shell block is run as pasted (tests/test_readme_blocks.py, and
    tests/integration/test_first_run.py for those on the broker)."""
    sections = {(block.document, block.heading) for block in shell_blocks()}
    assert CHECKED.keys() - sections == set(), "no such shell block any more"
    for test_id, _ in CHECKED.values():
        assert cited_test_exists(test_id), test_id


def test_every_runnable_block_is_run_by_one_of_the_two_runners() -> None:
    runnable = runnable_blocks(CHECKED)
    on_broker = broker_session(runnable)
    assert on_broker and on_broker[0].text.startswith("make broker-start")
    assert on_broker[-1].text.startswith("make broker-stop")
    assert all(commands(block.text) for block in runnable), "a block with no command"


def test_shown_output_is_matched_line_for_line_with_an_ellipsis_for_what_varies() -> None:
    output = "input retrieval.results/0/0\nrequest q30 | context 505 tokens\nrank  chunk\n"
    assert shows(["request q30 | context 505 tokens"], output)
    assert shows(["request … | context 505 tokens", "rank  chunk"], output)
    assert shows(["input …", "…", "rank  chunk"], output)
    assert not shows(["request q30 | context 504 tokens"], output), "a stale figure"
    assert not shows(["rank  chunk", "input retrieval.results/0/0"], output), "out of order"
    assert not shows(["input retrieval.results/0/0", "rank  chunk"], output), "not consecutive"
    assert not shows(["request"], output), "a whole line, not a part"


def test_a_block_is_read_as_commands_with_their_shown_output_and_exit_status() -> None:
    block = ("# 1. prose\nmake a \\\n    b   # inline\n#   printed\n#     indented\n\n"
             "# 2. exit status 2: fails\nfalse\nfor x in 1 2; do\n  echo $x\ndone\n")
    assert commands(block) == [
        Command("make a \\\n    b   # inline", ("printed", "  indented"), 0),
        Command("false", (), 2),
        Command("for x in 1 2; do\n  echo $x\ndone", (), 0),
    ]


@pytest.mark.parametrize("document", ["docs/performance.md", "docs/quality.md"])
def test_the_benchmark_commands_name_real_targets_and_flags(document: str) -> None:
    for block in fenced_blocks(document):
        if (block.document, block.heading) not in CHECKED:  # run as written elsewhere
            continue
        for line in block.text.splitlines():
            command = line.split("#")[0].split()
            if command[:1] == ["make"]:
                dry_run = subprocess.run(["make", "-n", *command[1:]], cwd=REPO, check=False,
                                         capture_output=True, text=True, timeout=60,
                                         env={"MAKEFLAGS": "-o .venv/bin/context-assembler",
                                              "PATH": "/usr/bin:/bin"})
                assert dry_run.returncode == 0, dry_run.stderr
            elif command:
                assert command[:2] == [".venv/bin/python", "-m"], line
                usage = subprocess.run([sys.executable, "-m", command[2], "--help"], cwd=REPO,
                                       capture_output=True, text=True, timeout=60, check=False)
                assert usage.returncode == 0, usage.stderr
                flags = [word for word in command[3:] if word.startswith("--")]
                assert all(flag in usage.stdout for flag in flags), (line, usage.stdout)


@pytest.mark.parametrize("document", USER_DOCS)
def test_no_internal_references(document: str) -> None:
    text = (REPO / document).read_text("utf-8")
    found = [(kind, match.group()) for kind, pattern in INTERNAL_REFERENCES.items()
             for match in pattern.finditer(text)]
    assert not found, f"{document}: {found}"


@pytest.mark.parametrize("document", USER_DOCS)
def test_every_kafka_proposal_named_is_linked(document: str) -> None:
    """A KIP number means nothing to most readers: each page that names one links it."""
    text = (REPO / document).read_text("utf-8")
    for number in set(KIP.findall(text)):
        assert re.search(rf"\[KIP-{number}\]\(https://cwiki\.apache\.org/\S*KIP-{number}", text), (
            f"{document} names KIP-{number} without linking it")


def test_the_internal_reference_patterns_find_what_they_are_for() -> None:
    examples = {"issue number": ["issue 8's targets", "faust-streaming #315", "(#606)"],
                "commit hash": ["on commit 292d588", "890bb96",
                                "2c4c0ba1f2b6a5a14a6a0c6f0e3b3c7d9e8f1a2b"],
                "seed number": ["seed 000's rules", "seeds 000 and 002"]}
    for kind, texts in examples.items():
        assert all(INTERNAL_REFERENCES[kind].search(text) for text in texts), kind
    for text in ["`doc#3`", "&#91;INST]", "sha256:beb395808aa56c9b", "1048576", "[S1]",
                 "worker.md#quick-start", "PYTHONHASHSEED", "the hash seed"]:
        assert not any(pattern.search(text) for pattern in INTERNAL_REFERENCES.values()), text


# A shipped file's pointer into the documentation: README "Section" or docs/page.md "Section".
POINTER = re.compile(r'\b(README|docs/[\w-]+\.md) "([^"]+)"')
SHIPPED = ["examples", "deploy", "scripts", "docker-compose.yml"]


def test_every_section_a_shipped_file_points_to_exists() -> None:
    files = [path for top in SHIPPED for path in ((REPO / top).rglob("*") if (REPO / top).is_dir()
                                                  else [REPO / top]) if path.is_file()]
    pointers = [(path.relative_to(REPO), page, section) for path in files
                for page, section in POINTER.findall(path.read_text("utf-8", "replace"))]
    assert pointers, "the shipped policy files point to their documentation"
    for path, page, section in pointers:
        document = "README.md" if page == "README" else page
        headings = {line.lstrip("#").strip() for line in (REPO / document).read_text(
            "utf-8").splitlines() if line.startswith("#")}
        assert section in headings, f"{path} points to {page} {section!r}, which does not exist"


def test_the_home_page_and_the_readme_name_the_same_ways_to_run_it() -> None:
    readme = [block_heading.removeprefix("### ").lower()
              for block_heading in section_headings("README.md", "## Ways to run it")]
    index = (REPO / "docs" / "index.md").read_text("utf-8")
    rows = re.findall(r"^\| ([^|]+?) \|", index.split("ways to run it", 1)[1], re.MULTILINE)
    shapes = [row.lower() for row in rows if row not in ("shape", "---")][:len(readme) + 1]
    assert len(readme) == 4 and shapes[:4] == readme, (readme, shapes)
    assert re.search(rf"^## {['One', 'Two', 'Three', 'Four'][len(readme) - 1]} ways to run it$",
                     index, re.MULTILINE)


def section_headings(document: str, heading: str) -> list[str]:
    """The headings one level below `heading` in `document`, in order."""
    level = heading.split()[0] + "#"
    lines = (REPO / document).read_text("utf-8").splitlines()
    start = lines.index(heading) + 1
    found, fenced = [], False
    for line in lines[start:]:
        fenced ^= line.startswith("```")
        if fenced or line.startswith("```"):
            continue
        if line.startswith("#") and len(line.split()[0]) < len(level):
            break
        if line.startswith(level + " "):
            found.append(line)
    return found


def test_the_readme_is_a_front_page() -> None:
    assert len((REPO / "README.md").read_text("utf-8").splitlines()) <= 200


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A broken link or anchor, a page missing from the nav or a missing include fails; the
    site carries its own Mermaid (`make check-docs` looks at it in a browser)."""
    mermaid = subprocess.run(["make", "-s", "tools/mermaid/node_modules/.package-lock.json"],
                             cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert mermaid.returncode == 0, mermaid.stderr
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                            "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                           text=True, timeout=300, check=False,
                           env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "site" / "http-api" / "index.html").read_text("utf-8").count(
        "/v1/assemble") > 1, "the OpenAPI reference is rendered"
    architecture = (tmp_path / "site" / "architecture" / "index.html").read_text("utf-8")
    assert '<pre class="mermaid">' in architecture
    assert '<script src="../assets/javascripts/mermaid.min.js">' in architecture
    bundled = tmp_path / "site" / "assets" / "javascripts" / "mermaid.min.js"
    assert bundled.stat().st_size > 1_000_000, "the Mermaid library itself"
