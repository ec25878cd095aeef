"""The engine version moves with the decisions (see `fingerprints.py`)."""

from __future__ import annotations

import re
from pathlib import Path

from context_assembler.engine.version import __version__
from tests.golden.fingerprints import fingerprints, recorded


def test_the_golden_outputs_are_those_recorded_for_this_engine_version() -> None:
    known = recorded()
    assert __version__ in known, (
        f"engine {__version__} has no recorded golden outputs: "
        "run python -m tests.golden.fingerprints")
    changed = {preset for preset, digest in fingerprints().items()
               if known[__version__].get(preset) != digest}
    assert not changed, (
        f"the outputs of {sorted(changed)} are not those engine {__version__} gave: a change "
        "of decisions raises worker/context_assembler/engine/version.py, then python -m tests.golden.fingerprints "
        "records the new version")



def test_the_changelog_says_what_each_recorded_engine_version_changed() -> None:
    changelog = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text("utf-8")
    headings = re.findall(r"^## (\S+)$", changelog, re.M)
    assert headings == sorted(recorded(), key=_version, reverse=True), (
        "CHANGELOG.md needs one section per engine version, newest first")
    assert headings[0] == __version__


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
