"""The library's public API: `import context_assembler` is all a caller needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import context_assembler as ca
from context_assembler.intake.codec import encode
from tests.support.docs import REPO, fenced_blocks

EVENTS = Path(__file__).parent / "golden" / "events.jsonl"


def test_the_public_names_are_importable_from_the_root() -> None:
    assert sorted(ca.__all__) == sorted(name for name in ca.__all__ if hasattr(ca, name))
    assert {"assemble", "load_policy", "RetrievalResult", "Policy"} <= set(ca.__all__)


def test_assemble_a_validated_event_under_a_preset_is_deterministic() -> None:
    line = EVENTS.read_text("utf-8").splitlines()[0]
    policy = ca.load_policy("default")
    first = ca.assemble(ca.RetrievalResult.model_validate_json(line), policy)
    second = ca.assemble(ca.RetrievalResult.model_validate_json(line), ca.load_policy(None))
    assert encode(first.prompt) == encode(second.prompt)
    assert encode(first.audit) == encode(second.audit)
    assert first.prompt.engine.version == ca.__version__
    kept = [c.chunk_id for c in first.audit.kept]
    assert kept and sorted(kept) == sorted(chunk.chunk_id for chunk in first.prompt.citations)
    accounted = sorted([*kept, *(d.chunk_id for d in first.audit.dropped)])
    assert accounted == sorted(c.chunk_id for c in ca.RetrievalResult.model_validate_json(line).chunks)


def test_assemble_takes_the_event_as_parsed_json_and_gives_the_same_bytes() -> None:
    policy = ca.load_policy("default")
    for line in EVENTS.read_text("utf-8").splitlines()[:5]:
        validated = ca.assemble(ca.RetrievalResult.model_validate_json(line), policy)
        parsed = ca.assemble(json.loads(line), policy)
        assert encode(parsed.prompt) == encode(validated.prompt)
        assert encode(parsed.audit) == encode(validated.audit)


@pytest.mark.parametrize(("change", "named"), [
    ({"chunks": "not a list"}, "chunks"),
    ({"question": None}, "question"),
    ({"as_of": "yesterday"}, "as_of"),
])
def test_a_mapping_that_is_not_an_event_is_a_clear_error_of_the_family(
    change: dict[str, object], named: str
) -> None:
    event = {**json.loads(EVENTS.read_text("utf-8").splitlines()[0]), **change}
    with pytest.raises(ca.InvalidEvent, match=f"not a RetrievalResult: .*{named}") as raised:
        ca.assemble(event, ca.load_policy("default"))
    assert isinstance(raised.value, ca.ContextAssemblerError)


def test_an_unknown_preset_is_a_policy_error_naming_the_presets() -> None:
    with pytest.raises(ca.PolicyError, match="default"):
        ca.load_policy("no-such-preset")
    assert "default" in ca.preset_names()


def test_the_library_page_example_runs_as_written() -> None:
    """docs/library.md's example, run from the repository root as a reader would."""
    (block,) = [b for b in fenced_blocks("docs/library.md") if b.language == "python"]
    result = subprocess.run([sys.executable, "-c", block.text], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("tokens in the prompt") and int(lines[0].split()[0]) > 0
    assert any(line.startswith("kept ") for line in lines)
    assert "dropped wcp-3-pumps access_denied" in lines


EVENT = ca.RetrievalResult(request_id="r1", question="q")


@pytest.mark.parametrize(("event", "policy", "named"), [
    ("an event", ca.Policy(), "event must be a RetrievalResult or a mapping, not str"),
    (None, ca.Policy(), "event must be a RetrievalResult or a mapping, not NoneType"),
    (5, None, "event must be a RetrievalResult or a mapping, not int"),
    ([], ca.Policy(), "event must be a RetrievalResult or a mapping, not list"),
    (EVENT, "default", "policy must be a Policy, not str"),
    (EVENT, None, "policy must be a Policy, not NoneType"),
])
def test_assemble_given_the_wrong_types_raises_the_documented_error(
    event: object, policy: object, named: str,
) -> None:
    with pytest.raises(ca.ContextAssemblerError, match=named) as caught:
        ca.assemble(event, policy)  # type: ignore[arg-type]
    assert isinstance(caught.value, TypeError)  # and what Python raises for a wrong type


@pytest.mark.parametrize("spec", [5, b"default", ["default"], 1.5])
def test_load_policy_given_the_wrong_type_raises_the_documented_error(spec: object) -> None:
    with pytest.raises(ca.ContextAssemblerError, match="load_policy: "):
        ca.load_policy(spec)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ["a" * 5000, "p/" * 3000, "a\0b"])
def test_a_policy_name_the_system_cannot_look_up_is_a_policy_error(spec: str) -> None:
    with pytest.raises(ca.PolicyError, match="no such policy file or preset") as caught:
        ca.load_policy(spec)
    assert len(str(caught.value)) < 400  # the name is quoted cut


def test_a_policy_file_may_be_named_by_a_path(tmp_path: Path) -> None:
    policy = tmp_path / "tight.toml"
    policy.write_text("[budget]\ncontext_tokens = 300\n")
    assert ca.load_policy(policy) == ca.load_policy(str(policy))
