"""Decompression bombs on a real broker: a few kilobytes that decompress to 256 MiB each.

A librdkafka producer writes, for each of zstd, gzip and lz4, one record of a JSON prefix and
256 MiB of spaces (8 KB as zstd, 260 KB as gzip, 1.1 MB as lz4), and for snappy 64 MiB (3 MB:
it compresses 21-fold at most), each followed by valid events in batches of their own; the
input topic takes 4 MB records for lz4's and snappy's. Under both guarantees the worker
dead-letters each bomb (reason `limits`, naming its offset), answers and commits every valid
event after it, and its peak resident set (the kernel's VmHWM) stays under PEAK_RSS_MIB:
before the bound, aiokafka decoded each bomb whole and the worker peaked at 1.1 GiB
(bench/README.md has the figures). `replay` over the same input writes the bombs' error
records and the valid events' prompts, under the same peak.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.bombs import (
    MEASURED_MAIN,
    TOPIC_MAX_MESSAGE_BYTES,
    bomb,
    librdkafka_send,
    peak_rss_mib,
)
from harness.kafka import Broker
from harness.worker import (
    ALLOWED_POLICIES,
    StartWorker,
    Topics,
    committed_offsets,
    end_offsets,
    events,
    read_topic,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
MiB = 1024 * 1024
BOMB_SPACES = {"zstd": 256 * MiB, "gzip": 256 * MiB, "lz4": 256 * MiB, "snappy": 64 * MiB}
CODECS = tuple(BOMB_SPACES)
VALID_AFTER_EACH = 2
# The default bound (ASSEMBLER_MAX_BATCH_BYTES, 32 MiB) decodes at most 32 MiB of a bomb, so
# the worker peaks at what it takes anyway (150-200 MiB with its vocabularies) plus that.
# Decoded whole, one 256 MiB bomb alone would take it past this.
PEAK_RSS_MIB = 256
# Records alive (read and not yet freed) are at most max_batch_bytes, plus one fetch call's
# last record and the batch being decoded: about 100 MiB more than a bomb costs.
FLOOD_BATCHES = 32
FLOOD_PEAK_RSS_MIB = 384


async def plant_bombs(broker: Broker, topics: Topics) -> list[bytes]:
    """Each codec's bomb at offsets 0, 3, 6 and 9, valid events after each; the valid ones."""
    await broker.create_topics({topics.input: 1},
                               configs={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})
    await topics.create(broker, partitions=1)
    valid = events(VALID_AFTER_EACH * len(CODECS))
    for n, codec in enumerate(CODECS):
        librdkafka_send(broker, topics.input, codec, [(f"bomb-{codec}".encode(),
                                                        bomb(BOMB_SPACES[codec]))])
        after = valid[n * VALID_AFTER_EACH:(n + 1) * VALID_AFTER_EACH]
        librdkafka_send(broker, topics.input, codec,
                        [(json.loads(v)["request_id"].encode(), v) for v in after])
    return valid


def assert_bombs_dead_lettered(letters: list[dict[str, bytes]]) -> None:
    assert len(letters) == len(CODECS)
    for letter, codec, offset in zip(letters, CODECS, (0, 3, 6, 9), strict=True):
        assert letter["__connect.errors.exception.class.name"] == b"RejectedInput.limits"
        assert letter["__connect.errors.offset"] == str(offset).encode()
        message = letter["__connect.errors.exception.message"].decode()
        assert message.startswith(f"record batch at offset {offset} ({codec}, "), message
        assert message.endswith("over max_batch_bytes=33554432: skipped unread"), message


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_bombs_are_dead_lettered_within_the_memory_bound(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    topics = Topics.fresh()
    valid = await plant_bombs(broker, topics)
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"})
    try:
        committed = guarantee == "exactly_once"
        dead = await read_topic(broker, topics.dlq, until=len(CODECS), committed_only=committed,
                                settle=1)
        prompts = await read_topic(broker, topics.prompts, until=len(valid),
                                   committed_only=committed, settle=1)
        assert worker.process is not None
        peak = peak_rss_mib(Path(f"/proc/{worker.process.pid}/status").read_text())
        print(f"{guarantee}: worker peak RSS {peak:.0f} MiB")
        assert peak < PEAK_RSS_MIB, f"{guarantee}: peak RSS {peak:.0f} MiB"
        assert_bombs_dead_lettered([dict(r.headers) for r in dead])
        assert all(r.value == b"" and r.key is None for r in dead)
        assert {r.key for r in prompts} == {json.loads(v)["request_id"].encode() for v in valid}
        await wait_for_commits(broker, topics, await end_offsets(broker, topics.input))
        assert worker.alive()
        text = (logs / "worker.log").read_text()
        assert text.count("skipped unread") == len(CODECS)  # one line each
    finally:
        assert worker.stop() == 0, worker.log_tail()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_batches_each_under_the_bound_are_read_within_the_memory_bound(
    broker: Broker, logs: Path, guarantee: str, running_worker: StartWorker
) -> None:
    """Each batch decodes (30 MiB of spaces, under the 32 MiB bound), so only the read-ahead's
    bound in bytes keeps them from piling up: 32 of them (32 KB on the broker) held 1.4 GiB
    when the read-ahead was counted in events only."""
    topics = Topics.fresh()
    await topics.create(broker, partitions=1)
    for n in range(FLOOD_BATCHES):
        librdkafka_send(broker, topics.input, "zstd", [(b"flood-%d" % n, bomb(30 * MiB))])
    valid = events(2)
    librdkafka_send(broker, topics.input, "zstd",
                    [(json.loads(v)["request_id"].encode(), v) for v in valid])
    worker = running_worker(topics, guarantee,
                            env={"ASSEMBLER_TRANSACTIONAL_ID": f"{topics.group}-0"})
    try:
        committed = guarantee == "exactly_once"
        prompts = await read_topic(broker, topics.prompts, until=len(valid),
                                   committed_only=committed, settle=1, timeout=300)
        assert worker.process is not None
        peak = peak_rss_mib(Path(f"/proc/{worker.process.pid}/status").read_text())
        print(f"{guarantee}: worker peak RSS {peak:.0f} MiB over the flood")
        assert peak < FLOOD_PEAK_RSS_MIB, f"{guarantee}: peak RSS {peak:.0f} MiB"
        assert {r.key for r in prompts} == {json.loads(v)["request_id"].encode() for v in valid}
        dead = await read_topic(broker, topics.dlq, until=FLOOD_BATCHES,
                                committed_only=committed, settle=1)
        assert len(dead) == FLOOD_BATCHES
        assert {dict(r.headers)["__connect.errors.exception.class.name"] for r in dead} == {
            b"RejectedInput.limits"}  # over max_event_bytes, as an event read whole would be
        await wait_for_commits(broker, topics, await end_offsets(broker, topics.input))
    finally:
        assert worker.stop() == 0, worker.log_tail()


async def wait_for_commits(broker: Broker, topics: Topics, ends: dict[int, int]) -> None:
    """The group's committed offsets reach the end of the input: past every bomb."""
    committed: dict[int, int] = {}
    deadline = time.monotonic() + 60
    while committed != ends:
        assert time.monotonic() < deadline, f"committed {committed}, end {ends}"
        await asyncio.sleep(0.5)
        committed = await committed_offsets(broker, topics.group, topics.input)


async def test_replay_reports_bombs_as_rejected_within_the_memory_bound(
    broker: Broker, tmp_path: Path
) -> None:
    topics = Topics.fresh()
    valid = await plant_bombs(broker, topics)
    out, errors = tmp_path / "prompts.jsonl", tmp_path / "errors.jsonl"
    allowed = [arg for name in ALLOWED_POLICIES for arg in ("--allow-policy", name)]
    measured = subprocess.run(  # in a process of its own, for its peak alone
        [sys.executable, "-c", MEASURED_MAIN,
         "replay", "--bootstrap-servers", broker.bootstrap_servers,
         "--input-topic", topics.input, "--prompts-topic", topics.prompts,
         "--audit-topic", topics.audit, *allowed, "--out", str(out), "--errors", str(errors)],
        capture_output=True, text=True, timeout=300, check=False)
    assert measured.returncode == 0, measured.stderr + measured.stdout
    peak = peak_rss_mib(measured.stderr)
    print(f"replay: peak RSS {peak:.0f} MiB")
    assert peak < PEAK_RSS_MIB, f"replay: peak RSS {peak:.0f} MiB"
    rejected = [json.loads(line) for line in errors.read_bytes().splitlines()]
    assert len(rejected) == len(CODECS)
    assert all(r["reason"] == "limits" and "skipped unread" in r["message"] for r in rejected)
    replayed = {json.loads(line)["request_id"] for line in out.read_bytes().splitlines()}
    assert replayed == {json.loads(v)["request_id"] for v in valid}
