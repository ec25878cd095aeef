"""How much of focused's cost an event is focusing itself: what a faster `focus` could win.

Run `python -m bench.focusing_share` (a few minutes). On `bench.engine_bench`'s generated
events (the same seeds, sizes and warm twins), three ways in turn:

- `default`: `Policy()`;
- focused: the `focused` preset under the same budget;
- focused with focusing free: the same, with `engine.focus.focus` replaced by the result it
  gave for the event before (recorded in a pass of its own), so that what is left is what
  focused costs besides choosing its sentences: candidates, rendering the extracts, the
  audit.

Each pass starts from empty caches and runs every warm event's twin (another question over
the same passages) under both policies first, as `engine_bench` does; cold events start
from empty caches. Every pass runs twice and each event keeps its lower CPU time (this
thread's). Printed: the medians of the per-event ratios to `default`, and what 1.5x
`default` leaves focusing, in microseconds an event, against what it takes.

A last pass times, within focusing, the work a faster way of choosing sentences would
still leave: the exact recount of the extracts (`focus._exact`), the copy checks of the
passages taken from (`CopyDetector`) and their headers rendered. Printed with it: what
focused would cost against `default` were choosing and the exact recount free (focusing
free, plus the copy checks and headers): where that is over 1.5x, no faster chooser
reaches the target while the rest of the engine costs what it does.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.corpus import Corpus
from bench.engine_bench import SEED, TARGET_FOCUSED_RATIO
from context_assembler.contract.models import RetrievalResult
from context_assembler.engine import Policy, assemble, caches
from context_assembler.engine import focus as focus_module
from context_assembler.engine.dedup import CopyDetector
from context_assembler.intake.policy_registry import load_policy

# The module, not the function `engine` exports under its name: where `focus` is looked up.
PIPELINE: Any = importlib.import_module("context_assembler.engine.assemble")
SIZES = {10: (60, 20), 40: (30, 10), 200: (6, 4)}  # chunks: (warm, cold) events
PASSES = 2
WAYS = ("default", "focused", "focusing free")


@contextmanager
def focusing(replace: Callable[..., Any] | None) -> Iterator[None]:
    """`focus` as the pipeline calls it replaced, for the time of the block."""
    real = PIPELINE.focus
    PIPELINE.focus = replace or real
    try:
        yield
    finally:
        PIPELINE.focus = real


def recorded(events: list[RetrievalResult], focused: Policy) -> dict[int, Any]:
    """What `focus` gave for each event (by its place), each from empty caches."""
    results: dict[int, Any] = {}
    real = PIPELINE.focus
    for place, event in enumerate(events):
        def record(*args: Any, place: int = place) -> Any:
            results[place] = real(*args)
            return results[place]
        caches.reset()
        with focusing(record):
            assemble(event, focused)
    return results


def warm_up(cases: list[tuple[str, RetrievalResult, RetrievalResult | None]],
            policies: dict[str, Policy]) -> None:
    """Empty caches, then the warm cases' twins under both policies."""
    caches.reset()
    for _, _, twin in cases:
        if twin is not None:
            assemble(twin, policies["default"])
            assemble(twin, policies["focused"])


def times(way: str, cases: list[tuple[str, RetrievalResult, RetrievalResult | None]],
          policies: dict[str, Policy], results: dict[int, Any]) -> list[int]:
    """CPU ns of each case under `way`, after empty caches and the warm cases' twins."""
    warm_up(cases, policies)
    spent = []
    for place, (regime, event, _) in enumerate(cases):
        if regime == "cold":
            caches.reset()
        replay = functools.partial(_given, results[place]) if way == "focusing free" else None
        with focusing(replay):
            start = time.thread_time_ns()
            assemble(event, policies["default" if way == "default" else "focused"])
            spent.append(time.thread_time_ns() - start)
    return spent


STAGES = ("exact recount", "copy checks", "headers")


def _timing_ns() -> int:
    """What reading the thread's clock around a call of nothing adds, median of many."""
    found = []
    for _ in range(2_001):
        start = time.thread_time_ns()
        found.append(time.thread_time_ns() - start)
    return int(statistics.median(found))


_TIMING_NS = _timing_ns()


@contextmanager
def staged(spent: dict[str, int]) -> Iterator[None]:
    """Within the block, the thread's CPU ns in each of `STAGES` added to `spent`, less
    what timing a call costs itself (`_TIMING_NS`)."""
    def timing(stage: str, run: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any) -> Any:
            start = time.thread_time_ns()
            try:
                return run(*args)
            finally:
                spent[stage] += max(0, time.thread_time_ns() - start - _TIMING_NS)
        return timed

    real_exact, real_focus = focus_module._exact, PIPELINE.focus
    real_twin, real_kept = CopyDetector.find_twin, CopyDetector.add_kept

    def focus(candidates: Any, packing: Any, detector: Any) -> Any:
        headed = dataclasses.replace(packing, header=timing("headers", packing.header))
        return real_focus(candidates, headed, detector)

    focus_module._exact = timing("exact recount", real_exact)
    CopyDetector.find_twin = timing("copy checks", real_twin)  # type: ignore[method-assign]
    CopyDetector.add_kept = timing("copy checks", real_kept)  # type: ignore[method-assign]
    try:
        with focusing(focus):
            yield
    finally:
        focus_module._exact = real_exact
        CopyDetector.find_twin = real_twin  # type: ignore[method-assign]
        CopyDetector.add_kept = real_kept  # type: ignore[method-assign]


def stage_times(cases: list[tuple[str, RetrievalResult, RetrievalResult | None]],
                policies: dict[str, Policy]) -> list[dict[str, int]]:
    """Each case's CPU ns in each of `STAGES` under focused, warmed as `times` warms."""
    warm_up(cases, policies)
    found = []
    for regime, event, _ in cases:
        if regime == "cold":
            caches.reset()
        spent = dict.fromkeys(STAGES, 0)
        with staged(spent):
            assemble(event, policies["focused"])
        found.append(spent)
    return found


def _given(result: Any, *_: Any) -> Any:
    """`focus` replayed: the result recorded for the event, whatever it is asked."""
    return result


def report(size: int, regime: str, best: dict[str, list[int]], stages: list[dict[str, int]]
           ) -> str:
    """Two lines: the ratios to `default` of the regime's events (`best`: each way's CPU ns
    an event), and what focusing takes against what the target leaves it; then what of it
    a faster chooser would still pay (`stages`: each event's)."""
    base = best["default"]

    def ratio(way: str) -> float:
        return statistics.median(s / d for s, d in zip(best[way], base, strict=True))

    default_us = statistics.median(base) / 1e3
    focusing_us = statistics.median(
        f - free for f, free in zip(best["focused"], best["focusing free"], strict=True)) / 1e3
    left_us = TARGET_FOCUSED_RATIO * default_us - statistics.median(best["focusing free"]) / 1e3
    medians = {stage: statistics.median(spent[stage] for spent in stages) / 1e3
               for stage in STAGES}
    kept = ", ".join(f"{stage} {us:.0f}" for stage, us in medians.items())
    floor = statistics.median(  # choosing and the exact recount free, the rest as it is
        (free + spent["copy checks"] + spent["headers"]) / d
        for free, spent, d in zip(best["focusing free"], stages, base, strict=True))
    return (f"{regime}, {size} chunks: focused {ratio('focused'):.2f}x default, focusing free "
            f"{ratio('focusing free'):.2f}x; focusing takes {focusing_us:.0f} us an event, "
            f"{TARGET_FOCUSED_RATIO:g}x default ({default_us:.0f} us) leaves it {left_us:.0f} us"
            f"\n  besides choosing: {kept} us "
            f"(together {sum(medians.values()):.0f} us); with choosing and the exact recount "
            f"free, focused would cost {floor:.2f}x default")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    default = Policy()
    policies = {"default": default,
                "focused": load_policy("focused").model_copy(update={"budget": default.budget})}
    for size, (warm, cold) in SIZES.items():
        corpus = Corpus(SEED * 613 + size)
        cases: list[tuple[str, RetrievalResult, RetrievalResult | None]] = [
            ("warm", event, twin) for event, twin in corpus.warm_events(size, warm)]
        cases += [("cold", corpus.cold_event(size, i), None) for i in range(cold)]
        results = recorded([event for _, event, _ in cases], policies["focused"])
        best: dict[str, list[int]] = {}
        for _ in range(PASSES):
            for way in WAYS:
                spent = times(way, cases, policies, results)
                best[way] = list(map(min, best.get(way, spent), spent))
        stages = stage_times(cases, policies)
        for regime in ("warm", "cold"):
            at = [place for place, case in enumerate(cases) if case[0] == regime]
            print(report(size, regime, {way: [t[p] for p in at] for way, t in best.items()},
                         [stages[p] for p in at]))


if __name__ == "__main__":
    main()
