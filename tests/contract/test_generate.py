"""The generated files follow the models, and a schema_version keeps its promise."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from context_assembler.contract.catalogue import TOPICS
from context_assembler.contract.models import SCHEMA_VERSION
from context_assembler.generate import schemas as generate
from context_assembler.generate.schemas import (
    incompatibilities,
    json_schemas,
    rendered,
    snapshot_dir,
)


def test_generated_schema_files_match_the_models() -> None:
    stale = [path.name for path, text in rendered().items()
             if not path.exists() or path.read_text() != text]
    assert stale == [], f"run `python -m context_assembler.generate.schemas`: {stale}"


VALIDATOR = Path(__file__).resolve().parents[2] / "tools" / "asyncapi"


@pytest.mark.skipif(shutil.which("node") is None or not (VALIDATOR / "node_modules").is_dir(),
                    reason="the AsyncAPI parser is not installed (make check-deploy installs it)")
def test_the_asyncapi_parser_accepts_the_document() -> None:
    document = generate.HERE / "asyncapi.yaml"
    result = subprocess.run(["node", str(VALIDATOR / "validate.mjs"), str(document)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid AsyncAPI 3.0.0" in result.stdout


def test_the_asyncapi_document_names_its_server_and_kafka_bindings() -> None:
    document = generate.asyncapi()
    (server,) = document["servers"].values()
    assert server["protocol"] == "kafka"
    for channel in document["channels"].values():
        assert channel["bindings"]["kafka"]["topic"] == channel["address"]
    messages = document["components"]["messages"]
    for topic in TOPICS:
        assert messages[topic.message]["bindings"]["kafka"]["key"]["type"] == "string", topic
    headed = {name for name, message in messages.items() if "headers" in message}
    assert headed == {"retrieval-result", "assembled-prompt", "assembly-audit", "dead-letter"}


def test_the_current_schemas_keep_the_promise_of_their_version() -> None:
    assert snapshot_dir().is_dir(), "run `python -m context_assembler.generate.schemas`"
    assert incompatibilities(json_schemas(), snapshot_dir()) == []


def _breaking(schemas: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The current schemas with a new required input field and a removed output field."""
    changed = copy.deepcopy(schemas)
    changed["retrieval-result"]["required"].append("tenant")
    changed["retrieval-result"]["properties"]["tenant"] = {"type": "string"}
    del changed["assembly-audit"]["properties"]["history_turns_dropped"]
    return changed


def test_a_breaking_change_within_the_version_is_named() -> None:
    problems = incompatibilities(_breaking(json_schemas()), snapshot_dir())
    assert problems == [
        "retrieval-result: tenant: required by new, not by old",
        "assembly-audit: history_turns_dropped: field removed",
    ]


def test_check_fails_on_a_breaking_change_and_passes_once_the_version_is_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    history = tmp_path / "history"
    shutil.copytree(snapshot_dir(), history / f"v{SCHEMA_VERSION}")
    monkeypatch.setattr(generate, "HISTORY", history)
    monkeypatch.setattr(generate, "HERE", tmp_path)
    monkeypatch.setattr(generate, "SERVED_OPENAPI", tmp_path / "served" / "openapi.json")
    (tmp_path / "served").mkdir()
    monkeypatch.setattr(generate, "json_schemas", lambda: _breaking(json_schemas()))
    monkeypatch.setattr("sys.argv", ["generate"])
    assert generate.main() == 1  # refuses to write files that break v1
    assert "breaking change within schema_version 1: retrieval-result: tenant" in (
        capsys.readouterr().err)
    assert not (tmp_path / "retrieval-result.schema.json").exists()

    monkeypatch.setattr(generate, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    assert generate.main() == 0  # a new version: written, and its snapshot recorded
    recorded = history / f"v{SCHEMA_VERSION + 1}" / "retrieval-result.schema.json"
    assert "tenant" in json.loads(recorded.read_text())["required"]
    monkeypatch.setattr("sys.argv", ["generate", "--check"])
    assert generate.main() == 0
