"""The engine version moves with the decisions (see `fingerprints.py`)."""

from __future__ import annotations

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

