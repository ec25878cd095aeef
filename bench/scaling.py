"""Does an event's cost grow linearly with its chunk count?

Run `python -m bench.scaling` (a few minutes; `--quick` for under one), `--json FILE` to keep
the numbers, `--strict` to exit 1 when the verdict fails. `make bench` runs it after the
engine benchmark.

For 10, 100, 1,000 and 10,000 chunks it times decode + assemble + encode (prompt and audit)
of generated events, in CPU time of this process:
- warm: each timed event's chunks were assembled once before under another question, as
  popular passages are;
- cold: every chunk text is new and the engine's caches are emptied first.
The 10,000-chunk events are over the worker's default `max_chunks`, so the limits here are
raised to each size: the engine's own growth is what is measured.

The sizes take turns, one event each in every round, so that the machine's load hits them
alike; and the collector is tuned as every long-running command tunes it once started
(`collector.collect_less`), so the figures are the file mode's, serve's and the worker's.

Verdict, for each regime: from the 100-chunk point on, the median cost of an event of n
chunks is at most 1.2 x (n / 100) x the 100-chunk median. Smaller events cost more per chunk
(the prompt's fixed parts), which the verdict does not count against them.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from bench.corpus import Corpus
from context_assembler.collector import collect_less
from context_assembler.engine import Policy, caches
from context_assembler.intake.codec import Limits, encode
from context_assembler.intake.handle import assemble_bytes
from context_assembler.intake.policy_registry import PolicyRegistry

SEED: Final = 20_261_202
SIZES: Final = (10, 100, 1000, 10_000)
BASE: Final = 100  # linear from this point
SLACK: Final = 1.2
EVENTS: Final = {"default": {10: 200, 100: 40, 1000: 8, 10_000: 3},
                 "quick": {10: 40, 100: 10, 1000: 3, 10_000: 1}}


@dataclass(frozen=True, slots=True)
class Row:
    regime: str
    chunks: int
    events: int
    median_ms: float
    per_chunk_us: float
    linear_ratio: float | None  # median / (n / BASE x median at BASE); None below BASE


def _runner(size: int, policy: Policy) -> Callable[[bytes], tuple[bytes, bytes]]:
    registry = PolicyRegistry(policy)
    limits = Limits(max_chunks=size, max_event_bytes=2**31 - 1)

    def run(raw: bytes) -> tuple[bytes, bytes]:
        assembly = assemble_bytes(raw, registry, limits)
        return encode(assembly.prompt), encode(assembly.audit)

    return run


def _cpu_ns(run: Callable[[bytes], object], raw: bytes) -> int:
    gc.collect()
    start = time.process_time_ns()
    run(raw)
    return time.process_time_ns() - start


def warm(sizes: Sequence[int], counts: dict[int, int], policy: Policy) -> dict[int, list[int]]:
    """Each timed event right after its twin (the same chunks, another question)."""
    runs = {size: _runner(size, policy) for size in sizes}
    pairs = {size: Corpus(SEED * 31 + size).warm_events(size, counts[size]) for size in sizes}
    samples: dict[int, list[int]] = {size: [] for size in sizes}
    for turn in range(max(counts.values())):
        for size in (size for size in sizes if turn < counts[size]):
            event, twin = pairs[size][turn]
            runs[size](encode(twin))
            samples[size].append(_cpu_ns(runs[size], encode(event)))
    return samples


def cold(sizes: Sequence[int], counts: dict[int, int], policy: Policy) -> dict[int, list[int]]:
    """Every text new, the caches emptied before each event."""
    runs = {size: _runner(size, policy) for size in sizes}
    corpora = {size: Corpus(SEED * 37 + size) for size in sizes}
    samples: dict[int, list[int]] = {size: [] for size in sizes}
    for turn in range(max(counts.values())):
        for size in (size for size in sizes if turn < counts[size]):
            raw = encode(corpora[size].cold_event(size, turn))
            caches.reset()
            samples[size].append(_cpu_ns(runs[size], raw))
    return samples


def rows(regime: str, samples: dict[int, list[int]]) -> list[Row]:
    medians = {size: statistics.median(found) / 1e6 for size, found in samples.items()}
    return [
        Row(regime, size, len(samples[size]), medians[size], medians[size] * 1000 / size,
            medians[size] / (size / BASE * medians[BASE]) if size >= BASE else None)
        for size in sorted(samples)
    ]


def table(found: Sequence[Row]) -> str:
    lines = [f"{'regime':<6} {'chunks':>6} {'events':>6} {'median ms':>10} "
             f"{'us/chunk':>9} {'vs linear':>9}"]
    for row in found:
        ratio = "" if row.linear_ratio is None else f"{row.linear_ratio:.2f}x"
        lines.append(f"{row.regime:<6} {row.chunks:>6} {row.events:>6} {row.median_ms:>10.2f} "
                     f"{row.per_chunk_us:>9.1f} {ratio:>9}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few events per size (< 1 min)")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when the verdict fails")
    args = parser.parse_args(argv)
    counts = EVENTS["quick" if args.quick else "default"]
    policy = Policy()
    collect_less()
    found: list[Row] = []
    for regime, measure in (("warm", warm), ("cold", cold)):
        found += rows(regime, measure(SIZES, counts, policy))
        print(f"  {regime}: {counts} events", file=sys.stderr)
    print(table(found))
    worst = max(row.linear_ratio or 0.0 for row in found)
    passed = worst <= SLACK
    print(f"verdict: every size >= {BASE} chunks within {SLACK:g}x of linear from {BASE}: "
          f"{'PASS' if passed else 'FAIL'} (worst {worst:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps([asdict(row) for row in found], indent=2) + "\n")
    return 1 if args.strict and not passed else 0


if __name__ == "__main__":
    raise SystemExit(main())
