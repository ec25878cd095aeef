"""Instructions an event, focused against `default`, under callgrind: deterministic where
timing on a shared machine is not.

Run `python -m bench.focused_instructions` (valgrind on PATH; a few minutes). Each figure is
two processes under `valgrind --tool=callgrind` with `PYTHONHASHSEED=1`: one that sets up
and assembles a warm-up event, one that does the same and then assembles the timed events;
the difference over the number of events is the cost an event (start-up and the
tokenizer's one-time load cancel). Warm: every event after a twin with another question
(its chunks' analyses and counts cached); cold: `caches.reset()` before each event.
NQ: the first 40 events of the NQ-open sample in bench/data; generated: 40-chunk events
of `bench.corpus` (10 warm, 4 cold), as `bench.engine_bench` builds them.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from context_assembler.contract.models import RetrievalResult
from context_assembler.engine import Policy, assemble, caches
from context_assembler.intake.policy_registry import load_policy

SOURCES = {"nq": (40, 40), "generated": (10, 4)}  # (warm, cold) events


Case = tuple[RetrievalResult, RetrievalResult | None]


def _events(source: str, regime: str) -> tuple[RetrievalResult, list[Case]]:
    """An event to warm up with, and (event, its twin run before it, or None) for the
    source and regime."""
    warm, cold = SOURCES[source]
    if source == "nq":
        from bench.quality import SAMPLE
        from context_assembler.diagnose.evaluate import read_labelled

        records = read_labelled(SAMPLE)
        found = [record.event for record in records[: warm + 1]]
        if regime == "cold":
            return records[-1].event, [(event, None) for event in found[:cold]]
        return records[-1].event, [
            (event, event.model_copy(update={"question": found[i + 1].question}))
            for i, event in enumerate(found[:warm])]
    from bench.corpus import Corpus
    from bench.engine_bench import SEED

    corpus = Corpus(SEED * 613 + 40)
    warm_up = Corpus(SEED).cold_event(40, 0)
    if regime == "cold":
        return warm_up, [(corpus.cold_event(40, i), None) for i in range(cold)]
    return warm_up, [(event, twin) for event, twin in corpus.warm_events(40, warm)]


def run(source: str, regime: str, policy_name: str, timed: bool) -> None:
    """One measured process's work: set up, a warm-up event, then (if `timed`) the events."""
    policy = Policy()
    if policy_name == "focused":
        policy = load_policy("focused").model_copy(update={"budget": policy.budget})
    warm_up, cases = _events(source, regime)
    assemble(warm_up, policy)
    if regime == "warm":
        for _, twin in cases:
            assert twin is not None
            assemble(twin, policy)
    if not timed:
        return
    for event, _ in cases:
        if regime == "cold":
            caches.reset()
        assemble(event, policy)


def instructions(source: str, regime: str, policy: str, timed: bool) -> int:
    """The instructions one measured process executes under callgrind."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             "-m", "bench.focused_instructions", "--child", source, regime, policy,
             "timed" if timed else "untimed"],
            check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "1"})
        found = re.search(r"^totals: (\d+)", out.read_text(), re.MULTILINE)
        assert found is not None
        return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--sources", nargs="+", default=list(SOURCES), choices=list(SOURCES))
    parser.add_argument("--regimes", nargs="+", default=["warm", "cold"],
                        choices=["warm", "cold"])
    args = parser.parse_args()
    if args.child:
        source, regime, policy, timed = args.child
        run(source, regime, policy, timed == "timed")
        return 0
    for source in args.sources:
        for regime in args.regimes:
            events = SOURCES[source][0 if regime == "warm" else 1]
            per_event = {}
            for policy in ("focused", "default"):
                spent = (instructions(source, regime, policy, True)
                         - instructions(source, regime, policy, False))
                per_event[policy] = spent / events
            print(f"{source} {regime}: focused {per_event['focused'] / 1e6:.2f} M, default "
                  f"{per_event['default'] / 1e6:.2f} M an event, "
                  f"{per_event['focused'] / per_event['default']:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
