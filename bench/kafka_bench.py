"""The worker through a real broker, on a ladder of contenders measured side by side.

    python -m bench.kafka_bench [--events 3000] [--rounds 3] [--rate R] [--rss-events 4000]
                                [--json out/kafka-bench.json] [--scale] [--kills 2]
                                [--only NAME ...] [--codec-rounds 2] [--codec-events 1500]
                                [--intervals MS ...] [--interval-rounds 2]

The ladder, each a process of its own on the same broker, in alternating rounds on fresh
topics (the order reversed every other round, so machine noise hits them alike):
- raw aiokafka: `bench.raw_passthrough`, the reference (getmany, gathered sends, 1 MiB
  batches, 5 ms linger, one commit per batch);
- faust passthrough: `bench.passthrough`, the worker's faust path with the engine taken out;
- worker ALO, worker EOS: the worker, at_least_once (faust) and exactly_once (transactions).

For each: throughput, a backlog of --events is produced first, then the contender starts;
events/s is N over the time from the first to the last prompt to arrive; CPU ms per event is
the process's CPU time (every thread) from the arrival of the first fifth of the prompts to
the last, over the events handled in between (warm-up left out, as in the engine's marginal
figure; a worker's events count from its handler's tally at the mark, so what its engine
did ahead of the prompts counts against it), and "engine ms" the
handler's wall time per event (the worker's assembly_duration histogram): the engine thread
waits for the GIL while the event loop runs, so a figure near the CPU one means the engine
thread is the bottleneck, and all of the process's Python work, not the engine's alone,
must shrink to go faster. Latency: events produced at half the contender's throughput
in that round (--rate R: at R events/s, or at half the throughput if that is less, so that
it is not overloaded) to the running contender for --latency-seconds; latency is the
prompt's arrival (read_committed) minus its input's create time (outputs carry the
input's timestamp). Medians of the rounds; each contender's events/s as a share of raw
aiokafka's in the same round, then the median of those shares.

RSS: the worker (each guarantee) over --rss-events events (`--rss-events 100000` for the long
run), fed as fast as the bench can produce; the resident set is sampled every second. Flat:
over the run's second half the RSS rises less than --plateau-mb above its first half's peak
(the first 10 % of the events, warm-up, left out).

Output codecs: the worker, each guarantee, publishing with each ASSEMBLER_COMPRESSION_TYPE
(none, gzip, snappy, lz4, zstd) through a backlog of --codec-events events, --codec-rounds
rounds in alternating order: events/s and CPU ms per event as above, and the bytes of its
prompts and audits per event as the broker stores them, so as they crossed the wire (the
record batches' sizes, headers included, read back from the topics); each codec beside
`none` in the same round.

Optional: --scale adds two ALO workers in one group to the ladder; --kills N adds the commit
cadence check: `bench.interval_commits` (faust's 1 s timer commits only) joins the ladder,
then it and the worker are each fed at 50 events/s and killed with SIGKILL N times, and the
duplicate prompts are counted per kill.

Commit intervals (--intervals 0 50 100 250): the exactly_once worker at each
ASSEMBLER_COMMIT_INTERVAL_MS, and raw aiokafka, each through a backlog of --events (warm-up)
and then fed at one rate (--rate, else half the first worker run's throughput) for
--latency-seconds, in alternating order over --interval-rounds rounds: p50 and p99 latency,
CPU ms per event at that rate and transactions per second (the worker's
transactions_total); and whether p50 <= interval + 2x raw aiokafka's p50 of the same round.

Floor: each worker's CPU per event against raw aiokafka's passthrough CPU per event plus the
engine's marginal CPU per event in the file mode on the same events (measured after each
round's ladder), round by round, so that the machine's load weighs on both sides: the
median of the rounds' ratios, at most 1.25x. Latency: with --rate below every throughput,
the at_least_once worker's p99 against raw aiokafka's in the same round, at most 2x.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from bench.corpus import Corpus
from context_assembler import filemode
from context_assembler.engine import caches
from context_assembler.intake.codec import Limits, encode
from context_assembler.intake.policy_registry import build_registry
from context_assembler.settings import DEFAULT_COMMIT_INTERVAL_MS
from harness.codecs import batches_of
from harness.kafka import Broker, broker_from_env
from harness.worker import Topics, WorkerProcess, read_topic

PARTITIONS = 6
ALO, EOS = "at_least_once", "exactly_once"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
KILL_RATE = 50.0  # events/s fed to a worker being killed
OUTPUT_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")  # ASSEMBLER_COMPRESSION_TYPE
CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}  # in a batch's header
COMPRESSION_BATCH = 10  # records a batch in `compression_cpu`
FLOOR_SLACK = 1.25  # a worker's CPU per event against raw aiokafka's + the engine's
LATENCY_SLACK = 2.0  # the at_least_once worker's p99 against raw aiokafka's at one rate
# Words of prose a passage (`Corpus`): the engine benchmark's passages (53 KB events of 20
# chunks), and shorter ones (17 KB), where the Kafka path weighs more against the engine.
WORKLOADS = {"bench": (250, 450), "corpus": (45, 100)}


@dataclass(frozen=True)
class Contender:
    name: str
    module: str
    guarantee: str = ALO
    workers: int = 1
    http: bool = True  # /ready and /metrics (raw aiokafka has neither)
    compression: str = "none"  # ASSEMBLER_COMPRESSION_TYPE (the worker's only)
    commit_interval_ms: int | None = None  # ASSEMBLER_COMMIT_INTERVAL_MS; None: its default


LADDER = [
    Contender("raw aiokafka", "bench.raw_passthrough", http=False),
    Contender("faust passthrough", "bench.passthrough"),
    Contender("worker ALO", "context_assembler.cli"),
    Contender("worker EOS", "context_assembler.cli", EOS),
]
SCALE = Contender("2 workers ALO", "context_assembler.cli", workers=2)
ONE_SECOND_COMMITS = Contender("1 s commits", "bench.interval_commits")  # beside the kills


@dataclass
class Result:
    name: str
    events_per_second: float
    cpu_ms_per_event: float
    engine_ms_per_event: float  # time in the handler (the engine thread), from /metrics
    latency_rate: float  # events/s: --rate, or half the throughput if that is less
    p50_ms: float
    p99_ms: float


def make_events(count: int, chunks: int, seed: int,
                workload: str = "bench") -> list[tuple[bytes, bytes]]:
    events = Corpus(seed, WORKLOADS[workload]).warm_events(chunks, count)
    return [(event.request_id.encode(), encode(event)) for event, _ in events]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of the processes, every thread included."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / TICK


def rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 1e6


async def fast_produce(broker: Broker, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all",
                                linger_ms=5, max_batch_size=1_048_576)
    await producer.start()
    try:
        for key, value in records:
            await producer.send(topic, value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def collect(
    broker: Broker, topic: str, count: int, timeout: float,
    on_batch: Callable[[int], None] | None = None,
) -> list[tuple[float, int]]:
    """(arrival time, create timestamp ms) of `count` committed records of `topic`;
    `on_batch(records so far)` after each fetch."""
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers,
                                isolation_level="read_committed", fetch_max_wait_ms=50)
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
            if on_batch is not None:
                on_batch(len(seen))
    finally:
        await consumer.stop()
    if len(seen) < count:
        raise TimeoutError(f"{topic}: {len(seen)} of {count} records after {timeout}s")
    return seen


async def start(broker: Broker, contender: Contender, topics: Topics,
                logs: Path) -> list[WorkerProcess]:
    tag = contender.name.replace(" ", "-")
    env = {"ASSEMBLER_COMPRESSION_TYPE": contender.compression}
    if contender.commit_interval_ms is not None:
        env["ASSEMBLER_COMMIT_INTERVAL_MS"] = str(contender.commit_interval_ms)
    return [WorkerProcess(broker, topics, logs / f"{tag}-{topics.group}-{i}.log",
                          guarantee=contender.guarantee, extra_env=env,
                          module=contender.module).start()
            for i in range(contender.workers)]


@dataclass
class Backlog:
    """A contender's run through a backlog, its processes still running."""

    topics: Topics
    procs: list[WorkerProcess]
    events_per_second: float
    cpu_ms_per_event: float
    engine_ms_per_event: float


async def run_backlog(broker: Broker, contender: Contender, events: list[tuple[bytes, bytes]],
                      logs: Path) -> Backlog:
    """Produce `events` to fresh topics, then start the contender on them; stopped only if
    this fails."""
    topics = Topics.fresh()
    await topics.create(broker, PARTITIONS)
    await fast_produce(broker, topics.input, events)
    procs = await start(broker, contender, topics, logs)
    pids = [p.process.pid for p in procs if p.process is not None]
    # (events handled, CPU seconds) once a fifth of the prompts arrived, and at the last one
    marks: list[tuple[float, float]] = []

    def handled(seen: int) -> float:
        """Events through the handler: what the workers' engines did ahead of the prompts
        that arrived (up to a read-ahead's worth) is not counted as done after the mark."""
        if not contender.http:
            return seen
        return sum(p.metric("context_assembler_events_total") for p in procs)

    def mark(seen: int) -> None:
        if (not marks and seen >= len(events) // 5) or seen >= len(events):
            marks.append((handled(seen), cpu_seconds(pids)))

    try:
        arrivals = await collect(broker, topics.prompts, len(events), 600, mark)
        times = sorted(t for t, _ in arrivals)
        (done0, cpu0), (_, cpu1) = marks[0], marks[-1]
        throughput = (len(times) - 1) / max(times[-1] - times[0], 1e-9)
        cpu_ms = (cpu1 - cpu0) * 1000 / max(len(times) - done0, 1)
        engine_ms = 0.0
        if contender.http:
            for proc in procs:
                proc.wait_ready()
            duration = "context_assembler_assembly_duration_seconds"
            engine_ms = 1000 * sum(p.metric(f"{duration}_sum") for p in procs) / max(
                sum(p.metric(f"{duration}_count") for p in procs), 1)
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    return Backlog(topics, procs, throughput, cpu_ms, engine_ms)


def p99(latencies: list[float]) -> float:
    """The 99th percentile of `latencies`, sorted as `latency` returns them."""
    return latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


async def run_round(broker: Broker, contender: Contender, events: list[tuple[bytes, bytes]],
                    args: argparse.Namespace, logs: Path) -> Result:
    backlog = await run_backlog(broker, contender, events, logs)
    throughput = backlog.events_per_second
    try:
        rate = throughput / 2 if args.rate is None else min(args.rate, throughput / 2)
        latencies = await latency(broker, backlog.topics, events, len(events), rate, args)
    finally:
        for proc in backlog.procs:
            proc.stop()
    return Result(contender.name, throughput, backlog.cpu_ms_per_event,
                  backlog.engine_ms_per_event, rate, statistics.median(latencies),
                  p99(latencies))


@dataclass
class CodecResult:
    guarantee: str
    codec: str
    events_per_second: float
    cpu_ms_per_event: float
    output_bytes_per_event: float  # prompts and audits, record batches as the broker stores them


async def codec_round(broker: Broker, guarantee: str, codec: str,
                      events: list[tuple[bytes, bytes]], logs: Path) -> CodecResult:
    """The worker publishing with ASSEMBLER_COMPRESSION_TYPE=codec through a backlog: its
    throughput and CPU, and the bytes its outputs took on the wire and on the broker."""
    contender = Contender(f"{guarantee} {codec}", "context_assembler.cli", guarantee,
                          compression=codec)
    backlog = await run_backlog(broker, contender, events, logs)
    for proc in backlog.procs:
        proc.stop()
    topics = backlog.topics
    size = sum([(await batches_of(broker, topic)).size
                for topic in (topics.prompts, topics.audit)])
    return CodecResult(guarantee, codec, backlog.events_per_second, backlog.cpu_ms_per_event,
                       size / len(events))


def _file_mode(events: list[tuple[bytes, bytes]]) -> tuple[io.BytesIO, io.BytesIO]:
    """The file mode over `events` under the default policy: its prompts and audits."""
    prompts, audits = io.BytesIO(), io.BytesIO()
    filemode.run([("bench", io.BytesIO(b"\n".join(value for _, value in events)))],
                 build_registry(None), Limits(), prompts=prompts, audits=audits,
                 errors=io.BytesIO())
    return prompts, audits


def _file_mode_cpu(events: list[tuple[bytes, bytes]]) -> float:
    """CPU seconds of the file mode over `events`, its caches empty at the start."""
    caches.reset()
    started = time.process_time()
    _file_mode(events)
    return time.process_time() - started


def engine_marginal_ms(events: list[tuple[bytes, bytes]]) -> float:
    """The engine's marginal CPU ms per event on the worker's own events: the file mode over
    all of them minus over the first fifth, per event in between (what a run costs whatever
    its length cancels out). Taken once a round; the floor's verdict is the rounds' median."""
    head = events[: len(events) // 5]
    return (_file_mode_cpu(events) - _file_mode_cpu(head)) * 1000 / (len(events) - len(head))


def floor_ratios(cpu: dict[str, list[float]], engine_ms: list[float]) -> dict[str, Any]:
    """Each worker's CPU per event against its floor, round by round: raw aiokafka's
    passthrough CPU per event plus the engine's marginal CPU per event, both measured in that
    round, so that the machine's load at the time weighs on both sides; then the medians of
    the rounds. `cpu`: each contender's CPU ms per event, a figure a round."""
    raw = cpu[LADDER[0].name]
    floors = [r + e for r, e in zip(raw, engine_ms, strict=True)]
    ratios = {name: [w / f for w, f in zip(cpu[name], floors, strict=True)]
              for name in ("worker ALO", "worker EOS") if cpu.get(name)}
    return {"raw_ms": statistics.median(raw), "engine_ms": statistics.median(engine_ms),
            "floor_ms": statistics.median(floors),
            "ratio": {name: statistics.median(r) for name, r in ratios.items()},
            "round_ratios": ratios}


def latency_ratio(results: dict[str, list[Result]], name: str) -> dict[str, Any] | None:
    """`name`'s p99 against raw aiokafka's in the same round, the median of the rounds, when
    both were fed at one rate in every round (--rate below both throughputs), else None."""
    if not results.get(name):
        return None
    pairs = list(zip(results[name], results[LADDER[0].name], strict=True))  # round by round
    if any(w.latency_rate != r.latency_rate for w, r in pairs):
        return None
    return {"rate": statistics.median(w.latency_rate for w, _ in pairs),
            "ratio": statistics.median(w.p99_ms / r.p99_ms for w, r in pairs)}


def compression_cpu(events: list[tuple[bytes, bytes]]) -> dict[str, float]:
    """CPU microseconds per event to build its prompt's and audit's record batches as
    aiokafka's producers do (their batch builder), with each codec, COMPRESSION_BATCH records
    a batch; medians of 5 passes. In one process, off the broker: the machine's other load
    moves it far less than the workers' CPU figures."""
    prompts, audits = _file_mode(events)
    batches = [lines[start:start + COMPRESSION_BATCH]
               for lines in (prompts.getvalue().splitlines(), audits.getvalue().splitlines())
               for start in range(0, len(lines), COMPRESSION_BATCH)]
    cpu: dict[str, float] = {}
    for codec in OUTPUT_CODECS:
        passes = []
        for _ in range(5):
            started = time.process_time()
            for batch in batches:
                builder = DefaultRecordBatchBuilder(
                    magic=2, compression_type=CODEC_IDS[codec], is_transactional=0,
                    producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
                for offset, value in enumerate(batch):
                    builder.append(offset, timestamp=0, key=None, value=value, headers=[])
                builder.build()
            passes.append(time.process_time() - started)
        cpu[codec] = statistics.median(passes) * 1e6 / len(events)
    return cpu


async def codec_rounds(broker: Broker, args: argparse.Namespace,
                       logs: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Each output codec under each guarantee, in alternating order; medians, and each
    codec's bytes and CPU beside `none`'s in the same round."""
    events = make_events(args.codec_events, args.chunks, args.seed, args.workload)
    builder_cpu = compression_cpu(events)
    rounds: dict[tuple[str, str], list[CodecResult]] = {}
    for round_ in range(args.codec_rounds):
        for guarantee in (ALO, EOS):
            for codec in OUTPUT_CODECS if round_ % 2 == 0 else OUTPUT_CODECS[::-1]:
                result = await codec_round(broker, guarantee, codec, events, logs)
                rounds.setdefault((guarantee, codec), []).append(result)
                print(f"codec round {round_ + 1} {guarantee:>13} {codec:>6}: "
                      f"{result.events_per_second:6.0f} events/s, "
                      f"{result.cpu_ms_per_event:5.2f} CPU ms/event, outputs "
                      f"{result.output_bytes_per_event / 1000:6.1f} KB/event", flush=True)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for (guarantee, codec), results in rounds.items():
        plain = rounds[guarantee, "none"]
        summary.setdefault(guarantee, {})[codec] = {
            "events_per_second": statistics.median(r.events_per_second for r in results),
            "cpu_ms_per_event": statistics.median(r.cpu_ms_per_event for r in results),
            "output_kb_per_event": statistics.median(
                r.output_bytes_per_event / 1000 for r in results),
            "bytes_share_of_none": statistics.median(
                r.output_bytes_per_event / p.output_bytes_per_event
                for r, p in zip(results, plain, strict=True)),
            "cpu_ms_over_none": statistics.median(
                r.cpu_ms_per_event - p.cpu_ms_per_event
                for r, p in zip(results, plain, strict=True)),
            "batch_cpu_us_per_event": builder_cpu[codec],
        }
    print(f"\noutput codecs: {args.codec_events} events of {args.chunks} chunks, "
          f"{args.codec_rounds} rounds (medians; beside none in the same round)")
    print(f"{'guarantee':>13}  {'codec':>6}  {'events/s':>8}  {'CPU ms/ev':>9}  "
          f"{'+CPU ms':>7}  {'KB/event':>8}  {'of none':>7}  {'batch CPU us/ev':>15}")
    for guarantee, codecs in summary.items():
        for codec, row in codecs.items():
            print(f"{guarantee:>13}  {codec:>6}  {row['events_per_second']:8.0f}  "
                  f"{row['cpu_ms_per_event']:9.2f}  {row['cpu_ms_over_none']:+7.2f}  "
                  f"{row['output_kb_per_event']:8.1f}  {row['bytes_share_of_none']:7.1%}  "
                  f"{row['batch_cpu_us_per_event']:15.0f}")
    return summary


async def latency(broker: Broker, topics: Topics, events: list[tuple[bytes, bytes]],
                  before: int, rate: float, args: argparse.Namespace) -> list[float]:
    """Latencies (ms, sorted) of events produced at `rate` to a running contender whose
    prompts topic holds `before` records."""
    wanted = int(rate * args.latency_seconds)  # at most twice the backlog's events
    stream = [(key + b"-latency", value) for key, value in (events * 2)[:wanted]]
    count = len(stream)
    ready = asyncio.Event()
    collector = asyncio.create_task(collect(
        broker, topics.prompts, before + count, 300,
        lambda seen: ready.set() if seen >= before else None))
    await ready.wait()  # the collector reads at the head of the topic
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    await producer.start()
    try:
        started = time.monotonic()
        for n, (key, value) in enumerate(stream):  # on a fixed schedule, not sleep after sleep
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            await producer.send(topics.input, value, key=key)
    finally:
        await producer.stop()
    later = (await collector)[before:]
    return sorted(arrival * 1000 - created for arrival, created in later)


@dataclass
class AtRate:
    """A contender fed at one rate: its latency, CPU and transactions."""

    rate: float  # events/s
    p50_ms: float
    p99_ms: float
    cpu_ms_per_event: float  # the process's CPU over the feed, per event fed
    transactions_per_second: float  # exactly_once only


async def at_rate(broker: Broker, contender: Contender, events: list[tuple[bytes, bytes]],
                  rate: float | None, args: argparse.Namespace, logs: Path) -> AtRate:
    """The contender through a backlog of `events` (its warm-up), then fed at `rate` (None:
    half its throughput through the backlog)."""
    backlog = await run_backlog(broker, contender, events, logs)
    procs = backlog.procs
    pids = [p.process.pid for p in procs if p.process is not None]

    def transactions() -> float:
        return sum(p.metric("context_assembler_transactions_total") for p in procs
                   ) if contender.http else 0.0

    try:
        rate = backlog.events_per_second / 2 if rate is None else rate
        cpu, count, began = cpu_seconds(pids), transactions(), time.monotonic()
        latencies = await latency(broker, backlog.topics, events, len(events), rate, args)
        seconds = time.monotonic() - began
        cpu, count = cpu_seconds(pids) - cpu, transactions() - count
    finally:
        for proc in procs:
            proc.stop()
    return AtRate(rate, statistics.median(latencies),
                  p99(latencies),
                  cpu * 1000 / len(latencies), count / seconds)


async def interval_rounds(broker: Broker, args: argparse.Namespace,
                          logs: Path) -> dict[str, dict[str, float]]:
    """The exactly_once worker at each commit interval and raw aiokafka, at one rate, in
    alternating order; medians of the rounds, and each interval's p50 against its bar:
    interval + 2x raw aiokafka's p50 in the same round."""
    events = make_events(args.events, args.chunks, args.seed)
    contenders = [Contender(f"EOS {ms} ms", "context_assembler.cli", EOS, commit_interval_ms=ms)
                  for ms in args.intervals] + [LADDER[0]]
    rate: float | None = args.rate
    runs: dict[str, list[AtRate]] = {c.name: [] for c in contenders}
    margins: dict[str, list[float]] = {c.name: [] for c in contenders[:-1]}  # bar - p50, ms
    for round_ in range(args.interval_rounds):
        for contender in contenders if round_ % 2 == 0 else contenders[::-1]:
            run = await at_rate(broker, contender, events, rate, args, logs)
            rate = run.rate  # the first run's, for every run
            runs[contender.name].append(run)
            print(f"interval round {round_ + 1} {contender.name:>12}: at {run.rate:4.0f} "
                  f"events/s p50 {run.p50_ms:6.1f} ms, p99 {run.p99_ms:6.1f} ms, "
                  f"{run.cpu_ms_per_event:5.2f} CPU ms/event, "
                  f"{run.transactions_per_second:5.1f} transactions/s", flush=True)
        raw = runs[LADDER[0].name][-1]
        for contender in contenders[:-1]:
            bar = (contender.commit_interval_ms or 0) + 2 * raw.p50_ms
            margins[contender.name].append(bar - runs[contender.name][-1].p50_ms)
    summary = {name: {"rate": statistics.median(r.rate for r in rs),
                      "p50_ms": statistics.median(r.p50_ms for r in rs),
                      "p99_ms": statistics.median(r.p99_ms for r in rs),
                      "cpu_ms_per_event": statistics.median(r.cpu_ms_per_event for r in rs),
                      "transactions_per_second": statistics.median(
                          r.transactions_per_second for r in rs),
                      "bar_minus_p50_ms": statistics.median(margins.get(name, [0.0]))}
               for name, rs in runs.items()}
    default = f"EOS {DEFAULT_COMMIT_INTERVAL_MS[EOS]} ms"
    print(f"\ncommit intervals: exactly_once at {rate:.0f} events/s, {args.interval_rounds} "
          f"rounds (medians); bar: p50 <= interval + 2x raw aiokafka's p50 (same round)")
    print(f"{'contender':>17}  {'p50 ms':>7}  {'p99 ms':>7}  {'CPU ms/ev':>9}  "
          f"{'txn/s':>6}  {'bar - p50':>9}")
    for name, row in summary.items():
        verdict = "" if name == LADDER[0].name else (
            f"  {'PASS' if row['bar_minus_p50_ms'] >= 0 else 'FAIL'}"
            + (" (the default)" if name == default else ""))
        print(f"{name:>17}  {row['p50_ms']:7.1f}  {row['p99_ms']:7.1f}  "
              f"{row['cpu_ms_per_event']:9.2f}  {row['transactions_per_second']:6.1f}  "
              f"{row['bar_minus_p50_ms']:+9.1f}{verdict}")
    return summary


@dataclass
class RssRun:
    guarantee: str
    events: int
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # s, events, MB
    growth_mb: float = 0.0
    first_half_peak_mb: float = 0.0
    ok: bool = False


async def rss_run(broker: Broker, guarantee: str, events: list[tuple[bytes, bytes]],
                  args: argparse.Namespace, logs: Path) -> RssRun:
    """The worker's resident set, sampled every second over args.rss_events events."""
    run = RssRun(guarantee, args.rss_events)
    topics = Topics.fresh()
    await topics.create(broker, PARTITIONS)
    proc = WorkerProcess(broker, topics, logs / f"rss-{guarantee}.log", guarantee=guarantee)
    proc.start()
    assert proc.process is not None
    pid = proc.process.pid
    stream = [(f"rss-{n}".encode(), events[n % len(events)][1]) for n in range(args.rss_events)]
    feeding = asyncio.create_task(fast_produce(broker, topics.input, stream))
    try:
        await asyncio.to_thread(proc.wait_ready)
        began = time.monotonic()
        done = 0
        while done < args.rss_events:
            await asyncio.sleep(1)
            done = int(await asyncio.to_thread(proc.metric, "context_assembler_events_total"))
            run.samples.append((round(time.monotonic() - began, 1), done, round(rss_mb(pid), 1)))
            if time.monotonic() - began > args.rss_events / 50 + 120:
                raise TimeoutError(f"rss run: {done} of {args.rss_events} events")
        await feeding
    finally:
        feeding.cancel()
        proc.stop()
    warm = [s for s in run.samples if s[1] >= args.rss_events // 10]
    half = len(warm) // 2
    run.first_half_peak_mb = max((s[2] for s in warm[:half]), default=0.0)
    run.growth_mb = max((s[2] for s in warm[half:]), default=0.0) - run.first_half_peak_mb
    run.ok = bool(half) and run.growth_mb < args.plateau_mb
    return run


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    events = make_events(args.events, args.chunks, args.seed, args.workload)
    logs = Path(tempfile.mkdtemp(prefix="kafka-bench-"))
    broker = broker_from_env(logs / "broker")
    broker.start()
    ladder = LADDER + ([SCALE] if args.scale else []) + ([ONE_SECOND_COMMITS] if args.kills else [])
    if args.only:
        ladder = [c for c in ladder if c.name in args.only or c is LADDER[0]]  # raw: the reference
    results: dict[str, list[Result]] = {c.name: [] for c in ladder}
    engine_ms: list[float] = []  # the engine's marginal CPU per event, a figure a round
    shares: dict[str, list[float]] = {c.name: [] for c in ladder}
    report: dict[str, Any] = {"events": args.events, "chunks": args.chunks,
                              "workload": args.workload,
                              "rounds": args.rounds, "rate": args.rate, "logs": str(logs)}
    try:
        for round_ in range(args.rounds):
            for contender in ladder if round_ % 2 == 0 else ladder[::-1]:
                result = await run_round(broker, contender, events, args, logs)
                results[contender.name].append(result)
                print(f"round {round_ + 1} {contender.name:>17}: "
                      f"{result.events_per_second:6.0f} events/s, "
                      f"{result.cpu_ms_per_event:5.2f} CPU ms/event (engine "
                      f"{result.engine_ms_per_event:4.2f}); at "
                      f"{result.latency_rate:4.0f} events/s p50 {result.p50_ms:6.1f} ms, "
                      f"p99 {result.p99_ms:6.1f} ms", flush=True)
            raw = results[LADDER[0].name][-1].events_per_second
            for name, rs in results.items():
                shares[name].append(rs[-1].events_per_second / raw)
            engine_ms.append(engine_marginal_ms(events))
            print(f"round {round_ + 1} {'engine':>17}: {engine_ms[-1]:5.2f} CPU ms/event "
                  "(file mode, marginal)", flush=True)
        rss = []
        if args.rss_events:
            for guarantee in (ALO, EOS):
                run = await rss_run(broker, guarantee, events, args, logs)
                rss.append(run)
                print(f"RSS {guarantee}: {run.events} events, first half peak "
                      f"{run.first_half_peak_mb:.0f} MB, second half {run.growth_mb:+.1f} MB: "
                      f"{'FLAT' if run.ok else 'GROWING'}", flush=True)
        if args.kills:
            report["duplicates_per_kill"] = await kill_rounds(broker, args, logs)
        if args.codec_rounds:
            report["output_codecs"] = await codec_rounds(broker, args, logs)
        if args.intervals:
            report["commit_intervals"] = await interval_rounds(broker, args, logs)
    finally:
        broker.stop()
        shutil.rmtree(logs / "broker", ignore_errors=True)  # GBs of topics; the logs stay

    summary: dict[str, dict[str, Any]] = {
        name: {"events_per_second": statistics.median(r.events_per_second for r in rs),
               "cpu_ms_per_event": statistics.median(r.cpu_ms_per_event for r in rs),
               "engine_ms_per_event": statistics.median(r.engine_ms_per_event for r in rs),
               "latency_rate": statistics.median(r.latency_rate for r in rs),
               "p50_ms": statistics.median(r.p50_ms for r in rs),
               "p99_ms": statistics.median(r.p99_ms for r in rs),
               "share_of_raw": statistics.median(shares[name]),
               "rounds": [asdict(r) for r in rs]}
        for name, rs in results.items() if rs}
    size = statistics.mean(len(value) for _, value in events) / 1000
    print(f"\n{args.events} events of {args.chunks} chunks ({args.workload}, {size:.0f} KB), "
          f"{PARTITIONS} partitions, {args.rounds} rounds (medians)")
    print(f"{'contender':>17}  {'events/s':>8}  {'of raw':>6}  {'CPU ms/ev':>9}  "
          f"{'engine ms':>9}  {'latency at':>10}  {'p50 ms':>7}  {'p99 ms':>7}")
    for name, row in summary.items():
        print(f"{name:>17}  {row['events_per_second']:8.0f}  {row['share_of_raw']:6.0%}  "
              f"{row['cpu_ms_per_event']:9.2f}  {row['engine_ms_per_event']:9.2f}  "
              f"{row['latency_rate']:6.0f} e/s  "
              f"{row['p50_ms']:7.1f}  {row['p99_ms']:7.1f}")
    print()
    if summary:
        floor = report["floor"] = floor_ratios(
            {name: [r.cpu_ms_per_event for r in rs] for name, rs in results.items()}, engine_ms)
        print(f"floor: raw aiokafka {floor['raw_ms']:.2f} + engine (file mode, marginal) "
              f"{floor['engine_ms']:.2f} = {floor['floor_ms']:.2f} CPU ms/event (medians); "
              + ", ".join(f"{name} {ratio:.2f}x ({'PASS' if ratio <= FLOOR_SLACK else 'FAIL'} "
                          f"<= {FLOOR_SLACK:g}x, median of the rounds' ratios)"
                          for name, ratio in floor["ratio"].items()))
        against_raw = report["alo_p99_against_raw"] = latency_ratio(results, "worker ALO")
        if against_raw is not None:
            verdict = "PASS" if against_raw["ratio"] <= LATENCY_SLACK else "FAIL"
            print(f"worker ALO p99 against raw aiokafka's at {against_raw['rate']:.0f} events/s: "
                  f"{against_raw['ratio']:.2f}x ({verdict} <= {LATENCY_SLACK:g}x)")
        elif "worker ALO" in summary:
            print("worker ALO p99 against raw aiokafka's: not fed at one rate (--rate R, below "
                  "both throughputs)")
    report["summary"] = summary
    report["rss"] = [asdict(run) for run in rss]
    return report


async def kill_rounds(broker: Broker, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    cadences = [("worker", "context_assembler.cli"), ("1 s commits", "bench.interval_commits")]
    duplicates: dict[str, list[float]] = {name: [] for name, _ in cadences}
    for round_ in range(args.rounds):
        for name, module in cadences if round_ % 2 == 0 else cadences[::-1]:
            per_kill = await kill_round(broker, name, module, args, logs)
            duplicates[name].append(per_kill)
            print(f"round {round_ + 1} {name:>12}: {per_kill:5.1f} duplicate prompts per "
                  f"kill -9 ({per_kill / KILL_RATE:.1%} of one second's events)", flush=True)
    kills: dict[str, dict[str, Any]] = {name: {"per_kill": statistics.median(counts),
                    "per_kill_over_rate": statistics.median(counts) / KILL_RATE,
                    "rounds": counts}
             for name, counts in duplicates.items()}
    share = kills["worker"]["per_kill_over_rate"]
    print(f"duplicate prompts per kill -9 at {KILL_RATE:g} events/s (medians): worker "
          f"{kills['worker']['per_kill']:.1f} ({share:.1%} of one second's events, target "
          f"<= 5 %: {'PASS' if share <= 0.05 else 'FAIL'}), 1 s commits "
          f"{kills['1 s commits']['per_kill']:.1f} "
          f"({kills['1 s commits']['per_kill_over_rate']:.1%})")
    return kills


async def kill_round(broker: Broker, name: str, module: str, args: argparse.Namespace,
                     logs: Path) -> float:
    """Duplicate prompts per kill -9 of a worker fed at KILL_RATE events/s."""
    topics = Topics.fresh()
    await topics.create(broker, PARTITIONS)
    count = int(KILL_RATE * args.kill_seconds)
    stream = make_events(count, args.chunks, args.seed + 1, args.workload)  # their own
    log = logs / f"kill-{name.replace(' ', '-')}-{topics.group}.log"
    proc = WorkerProcess(broker, topics, log, module=module).start()
    proc.wait_ready()
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all")
    await producer.start()

    async def feed() -> None:
        for key, value in stream:
            await producer.send(topics.input, value, key=key)
            await asyncio.sleep(1 / KILL_RATE)

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
    parser.add_argument("--events", type=int, default=3000, help="backlog per throughput run")
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="bench",
                        help="bench: the engine benchmark's passages (53 KB at 20 chunks); "
                        "corpus: shorter ones (17 KB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=None,
                        help="events/s in the latency phase (default: half the throughput)")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--rss-events", type=int, default=4000,
                        help="events per RSS run (0: none; 100000 for the long run)")
    parser.add_argument("--plateau-mb", type=float, default=16.0)
    parser.add_argument("--scale", action="store_true", help="add two ALO workers in one group")
    parser.add_argument("--kills", type=int, default=0, help="kill -9 per duplicates round")
    parser.add_argument("--kill-after", type=float, default=5.0,
                        help="seconds from a worker being ready (and catching up) to its kill")
    parser.add_argument("--kill-seconds", type=float, default=30.0,
                        help="length of the stream fed during the kills, in seconds")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run these contenders only (and raw aiokafka, the reference), "
                        "e.g. --only 'worker ALO'")
    parser.add_argument("--codec-rounds", type=int, default=2,
                        help="rounds of the output codecs, each guarantee (0: none)")
    parser.add_argument("--codec-events", type=int, default=1500,
                        help="backlog per output codec run")
    parser.add_argument("--intervals", type=int, nargs="+", metavar="MS",
                        help="exactly_once commit intervals to measure latency at, e.g. "
                        "--intervals 0 50 100 250")
    parser.add_argument("--interval-rounds", type=int, default=2,
                        help="rounds of the commit intervals")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", default="out/kafka-bench.json", help="write the results here")
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
