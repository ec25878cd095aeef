"""The chaos run: workers of each guarantee on a three-node cluster, faults on a seeded
schedule while events arrive at a steady rate, verdicts read from the topics afterwards.

    python -m bench.chaos [--long] [--seed 11] [--out out/chaos]

Short (the default; CI): three workers, a few thousand events and five faults per
guarantee (under exactly_once one of each kind, a paused worker among them). Long (`--long`,
`make chaos CHAOS=long`): ≥ 20,000 events and 20 faults per guarantee, drawn evenly from
every kind in bench.chaos.faults.

Each worker is a slot with its own group.instance.id (static membership): a slot killed and
started again is the same member. Under exactly_once the transactional ids are the workers'
default, one per input partition and the same in every slot, so a partition's new owner
fences its previous one.

Verdicts, from reading the prompts, audit and dead-letter topics to their ends with
isolation_level=read_committed after the workers stopped:
- lost: an input (read back from the input topic) with neither a prompt nor a dead letter;
- duplicates: prompt records beyond one per input (a promise under exactly_once only);
- mismatched: a prompt or an audit not byte-equal to the file mode's on the same event.
Latency: a prompt's first arrival (read_committed, while the run goes on) minus its input's
timestamp (the feeder stamps each input with its scheduled time). p50/p99 of the inputs
created in the 5 s before each fault, during it, and in the 5 s after it was undone.

Exit status 1 when a promise is broken: lost > 0, exactly_once duplicates > 0, or a
mismatch. A worker paused past the session timeout is the fault that exactly_once once
failed: aiokafka 0.14 commits offsets in a transaction without the group generation
(TxnOffsetCommit v0, no KIP-447), so the resumed zombie could commit a transaction for
partitions already given to another worker. The per-partition transactional ids fence it
now (`kafka/runtime/transactional.py`), and the short run (CI) includes that fault.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.chaos import faults
from bench.chaos.report import phase_latencies, write_report
from bench.kafka_bench import make_events
from harness.kafka import Cluster, ExternalBroker
from harness.worker import Topics, WorkerProcess, file_mode

ALO, EOS = "at_least_once", "exactly_once"
PARTITIONS = 6
WORKERS = 3
WARMUP_SECONDS = 8.0
SETTLE_SECONDS = 8.0  # between faults: the "after" window of one, the "before" of the next
SESSION_TIMEOUT = 10.0


@dataclass(frozen=True)
class Profile:
    name: str
    events: int
    rate: float  # events/s fed
    chunks: int
    faults: dict[str, list[str]]  # guarantee -> kinds, drawn evenly
    count: int  # faults per guarantee


SHORT = Profile("short", events=3000, rate=40.0, chunks=8, count=5, faults={
    ALO: [faults.KILL_WORKER, faults.PAUSE_WORKER, faults.PAUSE_BROKER,
          faults.ADD_REMOVE_WORKER],
    # Every kind once, the zombie (a paused worker) included.
    EOS: list(faults.KINDS),
})
LONG = Profile("long", events=21_000, rate=55.0, chunks=8, count=20,
               faults={ALO: list(faults.KINDS), EOS: list(faults.KINDS)})


@dataclass
class Arrivals:
    """First arrival (s since start) and create time (s since start) of each answered key."""

    first: dict[bytes, tuple[float, float]] = field(default_factory=dict)


@dataclass
class Verdict:
    inputs: int = 0
    answered: int = 0
    lost: int = 0
    duplicates: int = 0
    audit_duplicates: int = 0
    dead_letters: int = 0
    mismatched: int = 0
    examples: list[str] = field(default_factory=list)


def create_topics(servers: str, topics: Topics) -> None:
    """`context-assembler topics create --replication-factor 3` for this run's topic names."""
    env = {**os.environ, "ASSEMBLER_INPUT_TOPIC": topics.input,
           "ASSEMBLER_PROMPTS_TOPIC": topics.prompts, "ASSEMBLER_AUDIT_TOPIC": topics.audit,
           "ASSEMBLER_DLQ_TOPIC": topics.dlq, "ASSEMBLER_POLICIES_TOPIC": topics.policies}
    cli = Path(sys.executable).parent / "context-assembler"
    subprocess.run([str(cli), "topics", "create", "--bootstrap-servers", servers,
                    "--partitions", str(PARTITIONS), "--replication-factor", "3"],
                   env=env, check=True, capture_output=True)


async def feed(servers: str, topic: str, events: list[tuple[bytes, bytes]], rate: float,
               began: float, wall0: float) -> int:
    """Send the events on a fixed schedule, each stamped with its scheduled time; a send
    that fails is sent again at the end. Returns how many sends were retried."""
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all", enable_idempotence=True,
                                linger_ms=5, request_timeout_ms=60_000)
    await producer.start()
    pending: list[tuple[int, asyncio.Future[Any]]] = []
    try:
        for n, (key, value) in enumerate(events):
            due = began + WARMUP_SECONDS / 2 + n / rate
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            stamp = int((wall0 + (due - began)) * 1000)
            pending.append((n, await producer.send(topic, value, key=key, timestamp_ms=stamp)))
        await asyncio.wait([f for _, f in pending])
        failed = [n for n, f in pending if f.cancelled() or f.exception() is not None]
        for n in failed:
            key, value = events[n]
            await producer.send_and_wait(topic, value, key=key)
        return len(failed)
    finally:
        await producer.stop()


async def collect(servers: str, topic: str, arrivals: Arrivals, wall0: float,
                  stop: asyncio.Event) -> None:
    """First arrival of each prompt, read_committed, until `stop`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed",
                                fetch_max_wait_ms=50, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=100)
            now = time.time() - wall0
            for messages in batch.values():
                for m in messages:
                    if m.key not in arrivals.first:
                        arrivals.first[m.key] = (now, m.timestamp / 1000 - wall0)
    finally:
        await consumer.stop()


async def read_all(servers: str, topic: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of every committed record of `topic`, to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    out: list[tuple[bytes, bytes]] = []
    try:
        partitions = [TopicPartition(topic, p) for p in
                      sorted(consumer.partitions_for_topic(topic) or range(PARTITIONS))]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)  # the last stable offsets
        deadline = time.monotonic() + 300
        while [p for p in partitions if await consumer.position(p) < ends[p]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: not read to its end in 300 s")
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                out.extend((m.key or b"", m.value or b"") for m in messages)
    finally:
        await consumer.stop()
    return out


def digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


async def judge(servers: str, topics: Topics, expected_prompts: dict[str, bytes],
                expected_audits: dict[str, bytes]) -> Verdict:
    verdict = Verdict()
    inputs = {key for key, _ in await read_all(servers, topics.input)}
    verdict.inputs = len(inputs)
    answers: dict[str, dict[bytes, list[bytes]]] = {}
    for name, topic in (("prompts", topics.prompts), ("audits", topics.audit),
                        ("dlq", topics.dlq)):
        by_key: dict[bytes, list[bytes]] = defaultdict(list)
        for key, value in await read_all(servers, topic):
            by_key[key].append(digest(value))
        answers[name] = by_key
    prompts, audits, dlq = answers["prompts"], answers["audits"], answers["dlq"]
    verdict.dead_letters = sum(len(v) for v in dlq.values())
    answered = inputs & (set(prompts) | set(dlq))
    verdict.answered = len(answered)
    lost = sorted(inputs - answered)
    verdict.lost = len(lost)
    verdict.examples += [f"lost {k.decode()}" for k in lost[:5]]
    verdict.duplicates = sum(len(v) - 1 for v in prompts.values())
    verdict.audit_duplicates = sum(len(v) - 1 for v in audits.values())
    for key in sorted(inputs):
        name = key.decode()
        for got, expected in ((prompts, expected_prompts.get(name)),
                              (audits, expected_audits.get(name))):
            copies = got.get(key, [])
            if expected is None:  # the file mode rejects it: a dead letter, no output
                bad = bool(copies)
            else:
                bad = any(c != digest(expected) for c in copies) or (not copies and key in dlq)
            if bad:
                verdict.mismatched += 1
                if len(verdict.examples) < 10:
                    verdict.examples.append(f"mismatch {name}")
    return verdict


async def run_guarantee(cluster: Cluster, profile: Profile, guarantee: str, seed: int,
                        logs: Path, worker_env: dict[str, str]) -> dict[str, Any]:
    servers = cluster.bootstrap_servers
    topics = Topics.fresh()
    await asyncio.to_thread(create_topics, servers, topics)
    events = make_events(profile.events, profile.chunks, seed)
    expected_prompts, expected_audits = await asyncio.to_thread(
        file_mode, [value for _, value in events])
    rng = random.Random(f"{seed}-{guarantee}")
    plan = faults.schedule(profile.faults[guarantee], profile.count, rng.randrange(1 << 30))

    def spawn(slot: int) -> WorkerProcess:
        member = f"{topics.group}-w{slot}"
        env = {"ASSEMBLER_GROUP_INSTANCE_ID": member,
               "ASSEMBLER_SESSION_TIMEOUT_SECONDS": str(SESSION_TIMEOUT),
               "ASSEMBLER_LOG_LEVEL": "INFO", **worker_env}
        return WorkerProcess(ExternalBroker(servers), topics, logs / f"{guarantee}-w{slot}.log",
                             guarantee=guarantee, extra_env=env)

    workers = faults.Workers(spawn)
    try:
        for slot in range(WORKERS):
            workers.start(slot)
        await asyncio.gather(*(workers.ready(slot) for slot in range(WORKERS)))
    except BaseException:
        await asyncio.to_thread(workers.stop_all)
        raise
    print(f"{guarantee}: {WORKERS} workers ready; {profile.events} events at "
          f"{profile.rate:g}/s, faults: {', '.join(plan)}", flush=True)
    began, wall0 = time.monotonic(), time.time()
    arrivals = Arrivals()
    stop_collecting = asyncio.Event()
    collecting = asyncio.create_task(collect(servers, topics.prompts, arrivals, wall0,
                                             stop_collecting))
    feeding = asyncio.create_task(feed(servers, topics.input, events, profile.rate, began, wall0))
    done: list[faults.Fault] = []
    fed_seconds = WARMUP_SECONDS / 2 + profile.events / profile.rate
    spacing = (fed_seconds - WARMUP_SECONDS) / max(len(plan), 1)
    try:
        for n, kind in enumerate(plan):
            due = began + WARMUP_SECONDS + n * spacing
            await asyncio.sleep(max(SETTLE_SECONDS if done else 0.0, due - time.monotonic()))
            if not done:  # the first fault only once answers flow
                while len(arrivals.first) < profile.rate * 3:
                    await asyncio.sleep(0.5)
            at = time.monotonic() - began
            try:
                injected = await faults.inject(kind, workers, cluster, topics.input, rng,
                                               SESSION_TIMEOUT, began)
            except (TimeoutError, AssertionError, RuntimeError) as error:
                # Reported, and the run goes on: its verdicts say what this cost.
                cause = str(error).splitlines()[0]
                injected = [faults.Fault(kind, "", at, time.monotonic() - began, cause)]
            for fault in injected:
                done.append(fault)
                print(f"  {fault.at_s:6.1f}-{fault.end_s:6.1f} s  {fault.kind} ({fault.target})"
                      + (f" FAILED: {fault.error}" if fault.error else ""), flush=True)
        retried = await feeding
        deadline = time.monotonic() + 240
        while len(arrivals.first) < profile.events and time.monotonic() < deadline:
            await asyncio.sleep(1)
        await asyncio.sleep(2)
    finally:
        feeding.cancel()
        await asyncio.to_thread(workers.stop_all)
        stop_collecting.set()
        await collecting
    verdict = await judge(servers, topics, expected_prompts, expected_audits)
    latency = phase_latencies(arrivals.first.values(), done)
    violations = []
    if verdict.lost:
        violations.append(f"{verdict.lost} inputs lost")
    if guarantee == EOS and verdict.duplicates:
        violations.append(f"{verdict.duplicates} duplicate prompts to read_committed readers")
    if verdict.mismatched:
        violations.append(f"{verdict.mismatched} outputs differ from the file mode")
    print(f"{guarantee}: {verdict.inputs} inputs, lost {verdict.lost}, duplicates "
          f"{verdict.duplicates}, mismatched {verdict.mismatched}, p99 ms {latency['p99_ms']}"
          + (f"; VIOLATED: {'; '.join(violations)}" if violations else ""), flush=True)
    return {
        "guarantee": guarantee, "events": verdict.inputs, "workers": WORKERS,
        "brokers": cluster.nodes, "faults": [asdict(f) for f in done],
        "lost": verdict.lost, "duplicates": verdict.duplicates,
        **latency,
        "audit_duplicates": verdict.audit_duplicates, "dead_letters": verdict.dead_letters,
        "mismatched": verdict.mismatched, "resent_inputs": retried,
        "rate": profile.rate, "partitions": PARTITIONS, "session_timeout_s": SESSION_TIMEOUT,
        "violations": violations, "examples": verdict.examples,
        "timeline": sorted(arrivals.first.values()),
    }


def profile_of(args: argparse.Namespace) -> Profile:
    """The short or long profile, with what the command line overrides."""
    profile = LONG if args.long else SHORT
    guarantees = args.guarantees.split(",") if args.guarantees else list(profile.faults)
    kinds = args.kinds.split(",") if args.kinds else None
    unknown = set(kinds or []) - set(faults.KINDS)
    if unknown or not set(guarantees) <= {ALO, EOS}:
        raise SystemExit(f"unknown fault kinds or guarantees: {unknown or guarantees}")
    return replace(
        profile, events=args.events or profile.events, rate=args.rate or profile.rate,
        count=args.faults or profile.count,
        faults={g: kinds or profile.faults[g] for g in guarantees})


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    # The harness's own clients would log every refused connection to a stopped broker.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    profile = profile_of(args)
    workdir = Path(tempfile.mkdtemp(prefix="chaos-"))
    print(f"chaos ({profile.name}, seed {args.seed}): cluster and logs in {workdir}", flush=True)
    cluster = Cluster(workdir / "cluster")
    cluster.start()
    runs = []
    try:
        for guarantee in profile.faults:
            runs.append(await run_guarantee(cluster, profile, guarantee, args.seed, workdir,
                                            dict(args.worker_env)))
    finally:
        cluster.stop()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--long", action="store_true", help=">= 20,000 events, 20 faults each")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default="out/chaos")
    parser.add_argument("--guarantees", help="comma-separated (default: both)")
    parser.add_argument("--kinds", help=f"comma-separated, of: {', '.join(faults.KINDS)}")
    parser.add_argument("--faults", type=int, help="faults per guarantee")
    parser.add_argument("--events", type=int, help="events per guarantee")
    parser.add_argument("--rate", type=float, help="events/s fed")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        type=lambda text: tuple(text.split("=", 1)),
                        help="extra environment of the workers (e.g. PYTHONPATH=<other tree> "
                        "with PYTHONSAFEPATH=1, to run another version side by side)")
    args = parser.parse_args()
    runs = asyncio.run(main_async(args))
    out = Path(args.out)
    write_report(runs, out, {"profile": "long" if args.long else "short", "seed": args.seed,
                             "argv": sys.argv[1:]})
    print(f"report: {out / 'report.json'}  timeline: {out / 'timeline.png'}")
    broken = [f"{r['guarantee']}: {v}" for r in runs for v in r["violations"]]
    if broken:
        print("guarantees violated: " + "; ".join(broken), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

