"""Memory benchmark: a stream of maximum-size legal events must plateau well under 400 MB.

Run `python -m bench.memory_bench` (about a minute), `--events N` for the stream's length,
`--json FILE` to keep the numbers. Exit status 1 if the verdict fails.

A fresh subprocess (so nothing this process loaded counts) decodes each event from its JSON
bytes with the worker's limits, assembles it under the service's default policy and encodes
both records, as the worker does. Every text is new. The stream:
- first `--small-events` events of 2,000 chunks (`max_chunks`) of 1,900 characters: they fill the
  word-set cache, which must stop at its byte cap;
- then `--events` events of a short chunk and 40 of 99,000 characters (just under
  `max_chunk_chars` and, together, `max_event_bytes`): the short chunk is kept, so each long
  one is checked for being its copy and gets a word set; such word sets were once cached
  and held 776 MB after 15 events (the k8s limit was then 768 Mi).
After each event it reports the resident set (now and peak, `ru_maxrss`) and the bytes the
caches account for. Verdict: the peak stays under `--limit-mb`, and over the large events
the second half raises the resident set by less than `--plateau-mb` over the first half.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

from harness.budgets import WORKER_RSS_LIMIT_MB

LIMIT_MB: Final = WORKER_RSS_LIMIT_MB
PLATEAU_MB: Final = 32.0  # allocator noise; a leak of one event's word sets is ~100 MB
BIG_CHUNKS: Final = 41  # a short one first, then 40 long ones
BIG_CHARS: Final = 99_000
SMALL_CHUNKS: Final = 2000
SMALL_CHARS: Final = 1900  # with its JSON, 2,000 of them stay under 4 MiB
SEED: Final = 20_261_201


@dataclass(frozen=True, slots=True)
class Sample:
    event: int
    kind: str
    event_bytes: int
    rss_mb: float
    peak_mb: float
    word_cache_mb: float
    count_cache_mb: float


def rss_mb() -> float:
    """The resident set now (Linux: /proc/self/statm), in MB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6  # KiB on Linux


class Texts:
    """New English-like text on demand: Zipf-weighted words from a vocabulary large enough
    that a 99 KB chunk holds thousands of distinct words, as real long documents do."""

    def __init__(self, rng: random.Random) -> None:
        letters = "etaoinshrdlucmfwypvbgkjqxz"
        self.rng = rng
        self.vocabulary = [
            "".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(50_000)
        ]
        weights = [1 / rank for rank in range(1, len(self.vocabulary) + 1)]
        total, running = sum(weights), 0.0
        self.cumulative = []
        for weight in weights:
            running += weight / total
            self.cumulative.append(running)

    def text(self, chars: int) -> str:
        words = self.rng.choices(self.vocabulary, cum_weights=self.cumulative, k=chars // 5)
        for position in range(0, len(words), 40):  # sentences, now and then a number
            words[position] = f"{words[position].capitalize()} {self.rng.randrange(10**6)}."
        return " ".join(words)[:chars]


def event_bytes(texts: Texts, number: int, chunks: int, chars: int) -> bytes:
    event = {
        "request_id": f"mem-{number}",
        "question": "How long is the warranty on the pump of a pressure washer?",
        "chunks": [
            {
                "chunk_id": f"e{number}-c{i}",
                "doc_id": f"doc-{number}-{i}",
                "title": f"Guide {number}-{i}",
                "score": 1.0 - i / (2 * chunks),
                "text": f"Guide {number}-{i}\n{texts.text(chars if i else 500)}",
            }
            for i in range(chunks)
        ],
    }
    return json.dumps(event).encode()


def child(events: int, small_events: int) -> None:
    """Runs the stream in this process, one JSON sample per line on stdout."""
    from context_assembler.engine import Policy, assemble, facts, words
    from context_assembler.engine.tokens import get_counter
    from context_assembler.intake.codec import Limits, decode_event, encode

    limits, policy = Limits(), Policy()
    counter = get_counter(policy.tokenizer.encoding)
    texts = Texts(random.Random(SEED))
    plan = [("2000 x 1.9 KB", SMALL_CHUNKS, SMALL_CHARS)] * small_events
    plan += [("1 + 40 x 99 KB", BIG_CHUNKS, BIG_CHARS)] * events
    for number, (kind, chunks, chars) in enumerate(plan, start=1):
        raw = event_bytes(texts, number, chunks, chars)
        result = assemble(decode_event(raw, limits), policy)
        outputs = encode(result.prompt), encode(result.audit)
        del result, outputs
        sample = Sample(
            number, kind, len(raw), round(rss_mb(), 1), round(peak_mb(), 1),
            round((words.CACHE.nbytes + facts.FACTS.nbytes) / 1e6, 1),
            round(counter.cache.nbytes / 1e6, 1),  # type: ignore[attr-defined]
        )
        print(json.dumps(asdict(sample)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=30)
    parser.add_argument("--small-events", type=int, default=3)
    parser.add_argument("--limit-mb", type=float, default=LIMIT_MB)
    parser.add_argument("--plateau-mb", type=float, default=PLATEAU_MB)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.events, args.small_events)
        return 0

    command = [sys.executable, "-m", "bench.memory_bench", "--child",
               "--events", str(args.events), "--small-events", str(args.small_events)]
    samples: list[Sample] = []
    print(f"{'event':>5}  {'kind':<14} {'bytes':>9}  {'RSS MB':>7} {'peak MB':>8}  "
          f"{'word cache MB':>13} {'count cache MB':>14}")
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            sample = Sample(**json.loads(line))
            samples.append(sample)
            print(f"{sample.event:>5}  {sample.kind:<14} {sample.event_bytes:>9}  "
                  f"{sample.rss_mb:>7.1f} {sample.peak_mb:>8.1f}  {sample.word_cache_mb:>13.1f} "
                  f"{sample.count_cache_mb:>14.1f}", flush=True)
    if process.returncode != 0 or not samples:
        print(f"the benchmark process failed (exit status {process.returncode})")
        return 1

    peak = max(s.peak_mb for s in samples)
    large = samples[args.small_events :]
    half = len(large) // 2
    first_half = max((s.rss_mb for s in large[:half]), default=0.0)
    growth = max((s.rss_mb for s in large[half:]), default=0.0) - first_half
    ok = peak < args.limit_mb and growth < args.plateau_mb
    verdict = (
        f"peak RSS {peak:.0f} MB (limit {args.limit_mb:.0f}); large events: second half "
        f"{growth:+.0f} MB over the first half's peak of {first_half:.0f} MB (plateau: under "
        f"+{args.plateau_mb:.0f}): {'PLATEAU OK' if ok else 'FAIL'}"
    )
    print(verdict)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"samples": [asdict(s) for s in samples], "peak_mb": peak, "growth_mb": growth,
             "ok": ok}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
