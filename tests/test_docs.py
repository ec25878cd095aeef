"""The user documentation (README.md, SECURITY.md, docs/) stays true and stays for users.

Every shell block it shows is run by a named test, or is a command that needs what no test
machine has (a cluster, a Docker engine, minutes of benchmark) and is checked another way; the
tests it cites exist; it holds no internal references; and the site builds strictly.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs import REPO, Block, fenced_blocks, user_documents

CITED = re.compile(r"(tests/[\w/]+\.py)(?:::(\w+))?")
USER_DOCS = [*user_documents(), "SECURITY.md"]

# Shell blocks run word for word, by page and section: the test that runs them, and the file
# that takes them from the page (so that the page and what runs cannot drift apart).
READMES = "tests/test_readme_blocks.py"
QUICKSTART = ("tests/integration/test_first_run.py::"
              "test_the_docs_worker_quick_start_and_walkthroughs_work_word_for_word",
              "scripts/quickstart.sh")
RUN: dict[tuple[str, str], tuple[str, str]] = {
    ("README.md", "## Quick start"): (f"{READMES}::test_the_quick_start_demo_runs_as_shown",
                                      READMES),
    ("docs/getting-started.md", "## Quick start"): (
        f"{READMES}::test_the_quick_start_demo_runs_as_shown", READMES),
    ("README.md", "### File mode"): (f"{READMES}::test_the_file_mode_blocks_run_as_shown",
                                     READMES),
    ("docs/getting-started.md", "## Assemble your own events"): (
        f"{READMES}::test_the_file_mode_blocks_run_as_shown", READMES),
    ("README.md", "### HTTP endpoint"): (
        f"{READMES}::test_the_http_block_answers_with_a_prompt_and_an_audit", READMES),
    ("docs/http-api.md", "## Try it"): (
        f"{READMES}::test_the_http_block_answers_with_a_prompt_and_an_audit", READMES),
    ("docs/quality.md", "## Measure your own questions"): (
        f"{READMES}::test_the_evaluate_block_measures_the_shipped_questions", READMES),
    ("docs/secured-cluster.md", "## Least privilege: the ACLs"): (
        f"{READMES}::test_the_acls_block_prints_kafka_acls_commands", READMES),
    ("docs/worker.md", "## Quick start"): QUICKSTART,
    ("docs/debugging.md", "## Debug an answer"): QUICKSTART,
    ("docs/debugging.md", "### Under the policy that was in force"): QUICKSTART,
    ("docs/debugging.md", "## Re-drive dead letters"): QUICKSTART,
}
# Shell blocks no test machine can run as shown, and the test that checks what they act on.
CHECKED: dict[tuple[str, str], tuple[str, str]] = {
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
    ("docs/secured-cluster.md", "## Kubernetes"): (
        "tests/deploy/test_secured_manifests.py::"
        "test_every_pod_mounts_the_kafka_secret_read_only_and_optional",
        "needs a cluster: the pods mount the Secret it creates"),
    ("docs/operations.md", "## Faults on a replicated cluster"): (
        "tests/chaos/test_cluster_script.py",
        "starts three brokers (CI runs them in `make chaos`); the script's bookkeeping is "
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


def test_every_shell_block_is_run_by_a_test_or_checked_another_way() -> None:
    sections = {(block.document, block.heading) for block in shell_blocks()}
    assert not RUN.keys() & CHECKED.keys()
    assert sections - RUN.keys() - CHECKED.keys() == set(), "shell blocks no test runs or checks"
    assert (RUN.keys() | CHECKED.keys()) - sections == set(), "no such shell block any more"


def test_the_tests_named_for_the_shell_blocks_exist_and_read_their_pages() -> None:
    for block in shell_blocks():
        key = (block.document, block.heading)
        if key in RUN:
            test_id, runner = RUN[key]
            source = (REPO / runner).read_text("utf-8")
            assert block.document in source, f"{runner} does not read {block.document}"
            assert any(heading in source for heading in block.headings), (
                f"{runner} does not take {block.heading!r} from {block.document}")
        else:
            test_id, _ = CHECKED[key]
        assert cited_test_exists(test_id), test_id


@pytest.mark.parametrize("document", ["docs/performance.md", "docs/quality.md"])
def test_the_benchmark_commands_name_real_targets_and_flags(document: str) -> None:
    for block in fenced_blocks(document):
        if (block.document, block.heading) in RUN:  # run word for word by its own test
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


def test_the_readme_is_a_front_page() -> None:
    assert len((REPO / "README.md").read_text("utf-8").splitlines()) <= 200


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A broken link or anchor, a page missing from the nav or a missing include fails."""
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                            "--site-dir", str(tmp_path / "site")], cwd=REPO, capture_output=True,
                           text=True, timeout=300, check=False,
                           env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert build.returncode == 0, build.stderr
    assert (tmp_path / "site" / "http-api" / "index.html").read_text("utf-8").count(
        "/v1/assemble") > 1, "the OpenAPI reference is rendered"
