"""Fingerprints of the golden outputs: every preset on every golden event, per engine version.

Every output names the engine version that made it, so that a replay which differs from what
was published can tell a change of code from a change of policy. That holds only if the
version moves whenever the outputs do. `fingerprints.json` records, for each engine version,
a sha256 per preset of the outputs (prompt and audit, the version itself left out) that the
preset gives the golden events; `test_golden.py` fails when today's outputs differ from the
ones recorded for today's version.

After a change that alters decisions, raise `worker/context_assembler/engine/version.py` and record the new
version with `python -m tests.golden.fingerprints`; it refuses to change what an already
recorded version gives.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import orjson

from context_assembler.contract.models import RetrievalResult
from context_assembler.engine import assemble
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.version import __version__
from context_assembler.intake.policy_registry import load_preset, preset_names

HERE = Path(__file__).parent
RECORDED = HERE / "fingerprints.json"
# The contract fixtures (never regenerated) and the seeds' own cases.
EVENTS = (HERE.parent / "contract" / "fixtures" / "v1" / "retrieval-result.jsonl",
          HERE / "events.jsonl")


def golden_events() -> list[RetrievalResult]:
    return [RetrievalResult.model_validate_json(line)
            for path in EVENTS for line in path.read_bytes().splitlines() if line.strip()]


def outputs(preset: str) -> bytes:
    """What `preset` gives every golden event, one line each, the engine version left out."""
    policy = load_preset(preset)
    lines = []
    for event in golden_events():
        try:
            result = assemble(event, policy)
        except ContextAssemblerError as error:
            lines.append(orjson.dumps({"rejected": type(error).__name__, "why": str(error)}))
            continue
        for record in (result.prompt, result.audit):
            lines.append(orjson.dumps(record.model_dump(mode="json", exclude={"engine"})))
    return b"\n".join(lines)


def fingerprints() -> dict[str, str]:
    return {preset: "sha256:" + hashlib.sha256(outputs(preset)).hexdigest()
            for preset in sorted(preset_names())}


def recorded() -> dict[str, dict[str, str]]:
    loaded: dict[str, dict[str, str]] = json.loads(RECORDED.read_text("utf-8"))
    return loaded


def main() -> int:
    """Record today's fingerprints under today's engine version (new versions only)."""
    known, today = recorded(), fingerprints()
    if known.get(__version__, today) != today:
        print(f"engine {__version__} is recorded with other outputs: raise "
              "worker/context_assembler/engine/version.py first", file=sys.stderr)
        return 1
    known[__version__] = today
    RECORDED.write_text(json.dumps(known, indent=2) + "\n", "utf-8")
    print(f"recorded the golden outputs of engine {__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
