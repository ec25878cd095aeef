"""The worker through a real broker, beside a passthrough worker on the same broker.

    python -m bench.kafka_bench [--events 1500] [--chunks 20] [--rate 100] [--json FILE]

For each contender (passthrough = the same faust worker with the engine taken out; worker
= the real one; then two workers in one group), in alternating rounds on fresh topics:
- throughput: a backlog of N events is produced first, then the worker starts; events/s is
  N over the time from the first to the last output to arrive;
- latency: events are produced at a fixed rate to a ready worker; latency is the output's
  arrival minus the input's create time (outputs carry the input's timestamp).
Target: worker throughput >= 70 % of the passthrough's.

Commits (same run): "1 s commits" is the worker with its old cadence (faust's timer only,
`bench.interval_commits`); its throughput is measured beside the worker's. Then, for each
cadence, on fresh topics: events are produced at --rate while the worker is killed with
SIGKILL --kills times (each restarted at once), and the duplicate prompts (requests answered
more than once) are counted per kill, as a fraction of one second's events at that rate.
Targets: worker duplicates per kill <= 5 % of one second's events; worker throughput within
5 % of the 1 s cadence's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.corpus import Corpus
from tests.support.broker import Broker, broker_from_env
from tests.support.worker import Topics, WorkerProcess, produce, read_topic
from worker.intake.codec import encode

PARTITIONS = 6


@dataclass
class Result:
    name: str
    events_per_second: float
    p50_ms: float
    p99_ms: float


def make_events(count: int, chunks: int, seed: int) -> list[tuple[bytes, bytes]]:
    events = Corpus(seed).warm_events(chunks, count)
    return [(event.request_id.encode(), encode(event)) for event, _ in events]


async def collect(
    broker: Broker, topic: str, count: int, timeout: float,
    caught_up: tuple[int, asyncio.Event] | None = None,
) -> list[tuple[float, int]]:
    """(arrival time, create timestamp ms) for `count` records of `topic`.

    `caught_up` = (n, event): set the event once n records are in, so timing starts on a
    consumer that is already reading at the head of the topic.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    await consumer.start()
    seen: list[tuple[float, int]] = []
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        deadline = time.monotonic() + timeout
        while len(seen) < count and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time()
            for messages in batch.values():
                seen.extend((now, m.timestamp) for m in messages)
            if caught_up is not None and len(seen) >= caught_up[0]:
                caught_up[1].set()
    finally:
        await consumer.stop()
    if len(seen) < count:
        raise TimeoutError(f"{topic}: {len(seen)} of {count} records after {timeout}s")
    return seen


async def run_round(broker: Broker, name: str, module: str, workers: int,
                    events: list[tuple[bytes, bytes]], rate: float, logs: Path) -> Result:
    topics = Topics.fresh()
    await topics.create(broker, PARTITIONS)
    await produce(broker, topics.input, ((k, v, []) for k, v in events))
    procs = [WorkerProcess(broker, topics, logs / f"{name}-{i}.log", module=module).start()
             for i in range(workers)]
    try:
        arrivals = await collect(broker, topics.prompts, len(events), timeout=600)
        times = sorted(t for t, _ in arrivals)
        throughput = (len(times) - 1) / max(times[-1] - times[0], 1e-9)
        for proc in procs:
            proc.wait_ready()
        # Latency at a fixed rate, on a ready worker.
        latency_events = events[: int(rate * 10)]
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
        await producer.start()
        ready = asyncio.Event()
        collector = asyncio.create_task(
            collect(broker, topics.prompts, len(events) + len(latency_events), timeout=300,
                    caught_up=(len(events), ready)))
        await ready.wait()
        try:
            for key, value in latency_events:
                await producer.send(topics.input, value, key=key + b"-latency")
                await asyncio.sleep(1 / rate)
        finally:
            await producer.stop()
        later = (await collector)[len(events):]
        latencies = sorted((arrival * 1000 - created) for arrival, created in later)
        total = sum(p.metric('context_assembler_events_total{outcome="assembled"}')
                    for p in procs)
        assert total >= len(events) + len(latency_events), f"{name}: only {total} processed"
    finally:
        for proc in procs:
            proc.stop()
    return Result(name, throughput, statistics.median(latencies),
                  latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))])


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    events = make_events(args.events, args.chunks, args.seed)
    logs = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    broker = broker_from_env(logs / "broker")
    broker.start()
    contenders = [("passthrough", "bench.passthrough", 1), ("worker", "worker.cli", 1),
                  ("1 s commits", "bench.interval_commits", 1), ("2 workers", "worker.cli", 2)]
    results: dict[str, list[Result]] = {name: [] for name, _, _ in contenders}
    try:
        for round_ in range(args.rounds):
            order = contenders if round_ % 2 == 0 else contenders[::-1]
            for name, module, workers in order:
                result = await run_round(broker, name, module, workers, events, args.rate, logs)
                results[name].append(result)
                print(f"round {round_ + 1} {name:>12}: {result.events_per_second:7.0f} events/s, "
                      f"p50 {result.p50_ms:6.1f} ms, p99 {result.p99_ms:6.1f} ms", flush=True)
        cadences = [("worker", "worker.cli"), ("1 s commits", "bench.interval_commits")]
        duplicates: dict[str, list[float]] = {name: [] for name, _ in cadences}
        for round_ in range(args.rounds):
            for name, module in cadences if round_ % 2 == 0 else cadences[::-1]:
                per_kill = await kill_round(broker, name, module, args, logs)
                duplicates[name].append(per_kill)
                print(f"round {round_ + 1} {name:>12}: {per_kill:5.1f} duplicate prompts per "
                      f"kill -9 ({per_kill / args.rate:.1%} of one second's events)", flush=True)
    finally:
        broker.stop()
    summary = {name: {"events_per_second": statistics.median(r.events_per_second for r in rs),
                      "p50_ms": statistics.median(r.p50_ms for r in rs),
                      "p99_ms": statistics.median(r.p99_ms for r in rs)}
               for name, rs in results.items()}
    ratio = summary["worker"]["events_per_second"] / summary["passthrough"]["events_per_second"]
    scale = summary["2 workers"]["events_per_second"] / summary["worker"]["events_per_second"]
    print(f"\n{args.events} events of {args.chunks} chunks, {args.rounds} rounds (medians)")
    print(f"{'contender':>12}  {'events/s':>9}  {'p50 ms':>7}  {'p99 ms':>7}")
    for name, row in summary.items():
        print(f"{name:>12}  {row['events_per_second']:9.0f}  {row['p50_ms']:7.1f}  "
              f"{row['p99_ms']:7.1f}")
    verdict = "PASS" if ratio >= 0.7 else "FAIL"
    print(f"\nworker / passthrough throughput: {ratio:.0%} (target >= 70 %): {verdict}")
    print(f"2 workers / 1 worker throughput: {scale:.2f}x (2 cores shared with the broker)")
    cadence = summary["worker"]["events_per_second"] / summary["1 s commits"]["events_per_second"]
    kills = {name: {"per_kill": statistics.median(counts),
                    "per_kill_over_rate": statistics.median(counts) / args.rate,
                    "rounds": counts}
             for name, counts in duplicates.items()}
    share = kills["worker"]["per_kill_over_rate"]
    print(f"worker / 1 s commits throughput: {cadence:.0%} (target >= 95 %): "
          f"{'PASS' if cadence >= 0.95 else 'FAIL'}")
    print(f"duplicate prompts per kill -9 at {args.rate:g} events/s (medians): worker "
          f"{kills['worker']['per_kill']:.1f} ({share:.1%} of one second's events, target "
          f"<= 5 %: {'PASS' if share <= 0.05 else 'FAIL'}), 1 s commits "
          f"{kills['1 s commits']['per_kill']:.1f} "
          f"({kills['1 s commits']['per_kill_over_rate']:.1%})")
    return {"summary": summary, "worker_over_passthrough": ratio, "two_over_one": scale,
            "worker_over_1s_commits": cadence, "duplicates_per_kill": kills,
            "kills": args.kills, "rate": args.rate,
            "events": args.events, "chunks": args.chunks, "rounds": args.rounds}


async def kill_round(broker: Broker, name: str, module: str, args: argparse.Namespace,
                     logs: Path) -> float:
    """Duplicate prompts per kill -9 of a worker fed at `args.rate` events/s."""
    topics = Topics.fresh()
    await topics.create(broker, PARTITIONS)
    count = int(args.rate * args.kill_seconds)
    stream = make_events(count, args.chunks, args.seed + 1)  # requests of their own
    log = logs / f"kill-{name.replace(' ', '-')}-{topics.group}.log"
    proc = WorkerProcess(broker, topics, log, module=module).start()
    proc.wait_ready()
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    await producer.start()

    async def feed() -> None:
        for key, value in stream:
            await producer.send(topics.input, value, key=key)
            await asyncio.sleep(1 / args.rate)

    feeding = asyncio.create_task(feed())
    try:
        for _ in range(args.kills):
            await asyncio.sleep(args.kill_after)  # caught up, at the steady rate: kill
            proc.kill()
            proc = WorkerProcess(broker, topics, log, module=module).start()
            await asyncio.to_thread(proc.wait_ready, 120)
        await feeding
        prompts = await read_topic(broker, topics.prompts, until=count, timeout=300, settle=3)
    finally:
        feeding.cancel()
        await producer.stop()
        proc.stop()
    answered: Counter[bytes] = Counter(m.key for m in prompts)
    assert len(answered) == count, f"{name}: {count - len(answered)} requests lost"
    kills: int = args.kills
    return (sum(answered.values()) - count) / kills


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1500)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--rate", type=float, default=50.0, help="events/s in the latency phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kills", type=int, default=2, help="kill -9 per duplicates round")
    parser.add_argument("--kill-after", type=float, default=5.0,
                        help="seconds from a worker being ready (and catching up) to its kill")
    parser.add_argument("--kill-seconds", type=float, default=30.0,
                        help="length of the stream fed during the kills, in seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
