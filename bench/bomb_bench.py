"""Decompression bombs: the peak resident set of the worker and of `replay` reading one.

Run `python -m bench.bomb_bench` (about five minutes; a broker from the harness unless
KAFKA_BOOTSTRAP_SERVERS names one). For each codec, librdkafka writes one record of a JSON
prefix and `--mib` MiB of spaces (snappy at most 64: it compresses 21-fold at most, and the
topic takes 4 MB records), then two valid events; the worker under each guarantee, then
`replay`, reads it, and the peak (VmHWM) of each process is reported once it answered both
events. Run it with PYTHONPATH naming another checkout's `worker` folder to measure that
code (bench/README.md has the figures before and after the bound).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.bombs import (
    MEASURED_MAIN,
    TOPIC_MAX_MESSAGE_BYTES,
    MiB,
    bomb,
    librdkafka_send,
    peak_rss_mib,
)
from harness.kafka import Broker, running_broker
from harness.worker import ALLOWED_POLICIES, Topics, WorkerProcess, events, read_topic

CODECS = ("zstd", "gzip", "lz4", "snappy")
MOST_SNAPPY_MIB = 64


async def plant(broker: Broker, codec: str, mib: int) -> Topics:
    topics = Topics.fresh()
    await broker.create_topics({topics.input: 1},
                               configs={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})
    await topics.create(broker, partitions=1)
    size = min(mib, MOST_SNAPPY_MIB) if codec == "snappy" else mib
    librdkafka_send(broker, topics.input, codec, [(b"bomb", bomb(size * MiB))])
    librdkafka_send(broker, topics.input, codec,
                    [(json.loads(v)["request_id"].encode(), v) for v in events(2)])
    return topics


async def worker_peak(broker: Broker, topics: Topics, guarantee: str, logs: Path) -> float:
    worker = WorkerProcess(broker, topics, logs / f"{topics.group}.log", guarantee=guarantee,
                           extra_env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"}).start()
    try:
        worker.wait_ready()
        committed = guarantee == "exactly_once"
        await read_topic(broker, topics.prompts, until=2, committed_only=committed, timeout=180)
        await read_topic(broker, topics.dlq, until=1, committed_only=committed, timeout=60)
        assert worker.process is not None
        return peak_rss_mib(Path(f"/proc/{worker.process.pid}/status").read_text())
    finally:
        worker.stop()


def replay_peak(broker: Broker, topics: Topics, logs: Path) -> float:
    allowed = [arg for name in ALLOWED_POLICIES for arg in ("--allow-policy", name)]
    measured = subprocess.run(
        [sys.executable, "-c", MEASURED_MAIN, "replay",
         "--bootstrap-servers", broker.bootstrap_servers, "--input-topic", topics.input,
         "--prompts-topic", topics.prompts, "--audit-topic", topics.audit, *allowed,
         "--out", str(logs / f"{topics.group}.prompts"),
         "--errors", str(logs / f"{topics.group}.errors")],
        capture_output=True, text=True, timeout=300, check=False)
    if measured.returncode != 0:
        raise RuntimeError(f"replay exited {measured.returncode}: {measured.stderr[-2000:]}")
    return peak_rss_mib(measured.stderr)


async def measure(broker: Broker, mib: int, logs: Path) -> dict[str, dict[str, float]]:
    """Each codec's peaks: the worker under each guarantee (each on a bomb of its own, a
    group of its own), then replay."""
    peaks: dict[str, dict[str, float]] = {}
    for codec in CODECS:
        started = time.monotonic()
        peaks[codec] = {}
        for guarantee in ("at_least_once", "exactly_once"):
            topics = await plant(broker, codec, mib)
            peaks[codec][guarantee] = await worker_peak(broker, topics, guarantee, logs)
        peaks[codec]["replay"] = replay_peak(broker, topics, logs)
        shown = ", ".join(f"{mode} {peak:.0f}" for mode, peak in peaks[codec].items())
        print(f"{codec}: peak MiB {shown} ({time.monotonic() - started:.0f} s)", flush=True)
    return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB of spaces in each bomb")
    parser.add_argument("--json", type=Path, help="write the peaks (MiB) here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, running_broker(Path(folder)) as broker:
        peaks = asyncio.run(measure(broker, args.mib, Path(folder)))
    if args.json:
        args.json.write_text(json.dumps(peaks, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
