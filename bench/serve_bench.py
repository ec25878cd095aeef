"""HTTP endpoint benchmark: `POST /v1/assemble` against the in-process engine, same events.

Run `python -m bench.serve_bench` (about a minute), `--quick` (seconds), `--json FILE` to
keep the numbers.

The endpoint is a real `context-assembler serve` process on 127.0.0.1 (a free port); the
client is aiohttp in this process, one connection reused. In-process is what the endpoint
does for each request, without HTTP: decode + policy + assemble + encode
(`intake.handle.assemble_bytes` and `codec.encode`) on the same bytes. Events come from
bench/corpus.py (warm regime: each timed event's twin ran first on both sides, so chunk
counts and word sets are cached, as for a popular chunk set).

Reported per event size: requests/s and p50/p99 latency, sequential (one request at a time)
for both, and for the endpoint also with CONCURRENCY requests in flight (the engine runs in
one thread, so this measures what HTTP overlaps, not parallel assembly); and the ratios
endpoint/in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

import aiohttp

from bench.corpus import Corpus
from context_assembler.intake.codec import Limits, encode
from context_assembler.intake.handle import assemble_bytes
from context_assembler.intake.policy_registry import build_registry

SEED: Final = 20_260_611
SIZES: Final = (10, 40)
DEFAULT_COUNT: Final = 200
QUICK_COUNT: Final = 30
CONCURRENCY: Final = 8
JSON_BODY: Final = {"Content-Type": "application/json"}  # the endpoint answers 415 to others


def events(seed: int, size: int, count: int) -> list[tuple[bytes, bytes]]:
    """(twin, timed) event bytes."""
    return [(encode(twin), encode(timed))
            for timed, twin in Corpus(seed).warm_events(size, count)]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(latencies: list[float], wall: float | None = None) -> dict[str, float]:
    """req/s over `wall` (default: back to back, the sum of the latencies), p50, p99."""
    return {"requests_per_s": len(latencies) / (wall or sum(latencies)),
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


class Client:
    """POSTs events to the endpoint over one session."""

    def __init__(self, url: str, session: aiohttp.ClientSession) -> None:
        self.url = url
        self.session = session

    async def post(self, raw: bytes) -> float:
        begun = time.perf_counter()
        async with self.session.post(self.url, data=raw, headers=JSON_BODY) as response:
            await response.read()
            if response.status != 200:
                raise SystemExit(f"endpoint answered {response.status}")
        return time.perf_counter() - begun


async def side_by_side(url: str, pairs: list[tuple[bytes, bytes]]
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """One request at a time: each event in-process, then over HTTP, so machine noise hits
    both alike. Each twin ran first on both sides."""
    registry, limits = build_registry(None), Limits()
    local: list[float] = []
    remote: list[float] = []
    async with aiohttp.ClientSession() as session:
        client = Client(url, session)
        for twin, _ in pairs:
            assemble_bytes(twin, registry, limits)
            await client.post(twin)
        for _, raw in pairs:
            begun = time.perf_counter()
            assembly = assemble_bytes(raw, registry, limits)
            encode(assembly.prompt), encode(assembly.audit)
            local.append(time.perf_counter() - begun)
            remote.append(await client.post(raw))
    return summary(local), summary(remote)


async def concurrent(url: str, pairs: list[tuple[bytes, bytes]], width: int) -> dict[str, float]:
    """`width` requests in flight; req/s over the wall time of the whole run."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=width)) as session:
        client = Client(url, session)
        for twin, _ in pairs:
            await client.post(twin)
        gate = asyncio.Semaphore(width)

        async def one(raw: bytes) -> float:
            async with gate:
                return await client.post(raw)

        started = time.perf_counter()
        latencies = await asyncio.gather(*(one(raw) for _, raw in pairs))
        return summary(list(latencies), time.perf_counter() - started)


def start_server() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "context_assembler.cli", "serve", "--port", "0"],
        stderr=subprocess.PIPE, text=True,
    )
    assert process.stderr is not None
    found = re.search(r"(http://127\.0\.0\.1:\d+/v1/assemble)", process.stderr.readline())
    if found is None:
        process.kill()
        raise SystemExit("the endpoint did not start")
    return process, found.group(1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_COUNT} events per size")
    parser.add_argument("--count", type=int, help=f"events per size (default {DEFAULT_COUNT})")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()
    count = args.count or (QUICK_COUNT if args.quick else DEFAULT_COUNT)
    process, url = start_server()
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for size in SIZES:
            local, http = asyncio.run(side_by_side(url, events(SEED + size, size, count)))
            # Other events: the server's caches have not seen these questions.
            overlapped = asyncio.run(
                concurrent(url, events(SEED + size + 1, size, count), CONCURRENCY))
            results[f"{size} chunks"] = {"in-process": local, "http": http,
                                         f"http x{CONCURRENCY}": overlapped}
    finally:
        process.terminate()
        process.wait(timeout=30)
    print(f"{count} warm events per size, default policy; endpoint: one `serve` process")
    print(f"{'':10} {'contender':14} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for size_name, rows in results.items():
        for name, row in rows.items():
            print(f"{size_name:10} {name:14} {row['requests_per_s']:9.1f} {row['p50_ms']:8.2f}"
                  f" {row['p99_ms']:8.2f}")
        local, http = rows["in-process"], rows["http"]
        print(f"{size_name:10} http/in-process: p50 x{http['p50_ms'] / local['p50_ms']:.2f}, "
              f"p99 x{http['p99_ms'] / local['p99_ms']:.2f}, throughput "
              f"x{http['requests_per_s'] / local['requests_per_s']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
