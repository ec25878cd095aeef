"""Every Kafka codec in and out, with a client that is not aiokafka: librdkafka produces the
input with gzip, snappy, lz4 and zstd and reads the outputs read_committed; the worker
publishes with each ASSEMBLER_COMPRESSION_TYPE, which librdkafka and replay read back. And a
worker that cannot decode a codec (cramjam hidden from it) stops there, alive and unready."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.codecs import CODECS, batches_of, librdkafka_produce, librdkafka_read
from harness.kafka import Broker
from harness.worker import (
    ALLOWED_POLICIES,
    StartWorker,
    Topics,
    committed_offsets,
    end_offsets,
    events,
    file_mode,
    keyed,
    produce,
    read_topic,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]
PER_CODEC = 60


def request_ids(lines: list[bytes]) -> list[bytes]:
    return [json.loads(line)["request_id"].encode() for line in lines]


# Each output codec once, the guarantees alternating: four worker runs in all.
@pytest.mark.parametrize(("guarantee", "output"), [
    ("at_least_once", "zstd"), ("exactly_once", "lz4"),
    ("at_least_once", "gzip"), ("exactly_once", "snappy"),
])
async def test_librdkafka_input_in_every_codec_is_answered_and_read_back_byte_equal(
    broker: Broker, logs: Path, guarantee: str, output: str, running_worker: StartWorker,
) -> None:
    topics = Topics.fresh()
    await topics.create(broker)
    lines = events(PER_CODEC * len(CODECS))
    expected_prompts, expected_audits = file_mode(lines)
    worker = running_worker(topics, guarantee, env={"ASSEMBLER_COMPRESSION_TYPE": output},
                            ready=False)
    try:
        await asyncio.to_thread(worker.wait_ready)
        for n, codec in enumerate(CODECS):
            share = lines[n * PER_CODEC:(n + 1) * PER_CODEC]
            await asyncio.to_thread(librdkafka_produce, broker, topics.input, codec,
                                    zip(request_ids(share), share, strict=True))
        prompts = await asyncio.to_thread(librdkafka_read, broker, topics.prompts, len(lines))
        audits = await asyncio.to_thread(librdkafka_read, broker, topics.audit, len(lines))
        assert len(prompts) == len(audits) == len(lines)  # each answered once
        assert {key.decode(): value for key, value in prompts} == expected_prompts
        assert {key.decode(): value for key, value in audits} == expected_audits
        assert set((await end_offsets(broker, topics.dlq)).values()) == {0}
        assert worker.alive()
    finally:
        assert worker.stop() == 0
    assert (await batches_of(broker, topics.input)).codecs == set(CODECS)
    for topic in (topics.prompts, topics.audit, topics.policies):
        assert (await batches_of(broker, topic)).codecs == {output}, topic
    # Our own reading commands: replay reads the input, the outputs and the policies topic.
    allowed = [arg for name in ALLOWED_POLICIES for arg in ("--allow-policy", name)]
    replay = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "context_assembler.cli", "replay", "--bootstrap-servers",
                         broker.bootstrap_servers, "--input-topic", topics.input,
                         "--prompts-topic", topics.prompts, "--audit-topic", topics.audit,
                         "--policies-topic", topics.policies, "--policy", "recorded",
                         "--compare", *allowed],
        capture_output=True, text=True, timeout=120, check=False)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"{len(lines)} identical, 0 different, 0 not published" in replay.stdout


async def test_a_codec_the_worker_cannot_decode_stops_it_unready_and_uncommitted_past_it(
    broker: Broker, logs: Path, tmp_path: Path, running_worker: StartWorker,
) -> None:
    hidden = tmp_path / "no-codecs"
    hidden.mkdir()
    (hidden / "cramjam.py").write_text("raise ImportError('an image without the codec extras')\n")
    topics = Topics.fresh()
    await topics.create(broker, partitions=1)
    plain, compressed = events(10)[:5], events(10)[5:]
    worker = running_worker(topics, env={"PYTHONPATH": str(hidden),
                                      "ASSEMBLER_COMPRESSION_TYPE": "gzip"}, ready=False)
    try:
        await asyncio.to_thread(worker.wait_ready)
        await produce(broker, topics.input, keyed(plain))
        await asyncio.to_thread(librdkafka_produce, broker, topics.input, "snappy",
                                zip(request_ids(compressed), compressed, strict=True))
        prompts = await read_topic(broker, topics.prompts, until=len(plain), settle=1)
        assert {r.key for r in prompts} == set(request_ids(plain))

        def unready() -> bool:
            return worker.get("/ready")[0] == 503

        await wait_for(unready)
        reason = json.loads(worker.get("/ready")[1])["reason"]
        assert "snappy" in reason and "cramjam" in reason, reason
        deadline = time.monotonic() + 30
        while (await committed_offsets(broker, topics.group, topics.input) != {0: len(plain)}
               and time.monotonic() < deadline):
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)  # a crash, a restart or a commit past the batch would show by now
        assert worker.alive() and worker.get("/health")[0] == 200
        assert await committed_offsets(broker, topics.group, topics.input) == {0: len(plain)}
        assert set((await end_offsets(broker, topics.dlq)).values()) == {0}
        said = [line for line in worker.log_path.read_text().splitlines()
                if "cannot decode" in line]
        assert len(said) == 1 and "snappy" in said[0] and "cramjam" in said[0], said
    finally:
        assert worker.stop() == 0
