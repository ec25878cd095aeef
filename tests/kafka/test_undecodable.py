"""Compressed input the process cannot decode (cramjam missing, as in an image built without
aiokafka's codec extras): the real decoder raises on a real snappy batch, and each consumer
stops reading with one line naming the codec and the package, /ready false, nothing
committed past it. Every codec decoded and published: tests/integration/test_codecs.py."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest
from aiokafka import TopicPartition, codec
from aiokafka.errors import UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from faust.transport.drivers import aiokafka as faust_aiokafka

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka import clients
from context_assembler.kafka.clients import KafkaClients
from context_assembler.kafka.runtime.faust_app import _ConsumerThread
from context_assembler.kafka.runtime.runner import EventRunner
from context_assembler.kafka.tools.reader import Span, TopicReader
from context_assembler.kafka.undecodable import Undecodable
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings, SettingsError, load_settings
from tests.kafka.runtime.test_transactional import Rig, records
from tests.kafka.test_records import GOOD

TP0 = TopicPartition("in", 0)
SNAPPY = 2  # the batch header's codec id


def snappy_batch() -> bytes:
    """A record batch as a producer compressing with snappy sends it (built while cramjam is
    still there)."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=SNAPPY, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for offset in range(3):
        builder.append(offset, timestamp=1_700_000_000_000, key=b"k", value=GOOD, headers=[])
    return bytes(builder.build())


def decode(batch: bytes) -> list[Any]:
    """What a consumer's fetch does with the batch: raises UnsupportedCodecError without
    the codec's library."""
    return list(MemoryRecords(batch).next_batch())


@pytest.fixture
def without_cramjam(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """A snappy batch, and a process that can no longer decode it."""
    batch = snappy_batch()
    assert len(decode(batch)) == 3
    monkeypatch.setattr(codec, "cramjam", None)
    monkeypatch.setitem(sys.modules, "cramjam", None)  # and the settings cannot import it
    return batch


def test_the_reason_names_the_codec_and_the_missing_package(without_cramjam: bytes) -> None:
    with pytest.raises(UnsupportedCodecError) as raised:
        decode(without_cramjam)
    runner = EventRunner(Settings(input_topic="retrieval.results", compression_type="none"),
                         PolicyRegistry(Policy()), Metrics())
    try:
        runner.cannot_decode(raised.value)
        assert runner.blocked == (
            "cannot decode snappy-compressed records of retrieval.results: the cramjam package "
            "is not installed (pip install 'aiokafka[snappy,lz4,zstd]')")
    finally:
        runner.close()


class CodecConsumer:
    """The exactly_once consumer: one batch of plain records, then the snappy batch."""

    def __init__(self, batch: bytes, rig: Rig) -> None:
        self._batch = batch
        self._rig = rig
        self.fetches = 0
        self.stopped = False

    def subscribe(self, topics: list[str], listener: Any) -> None:
        self._listener = listener

    def last_stable_offset(self, tp: TopicPartition) -> int:
        return 0

    async def start(self) -> None:
        self._rig.consumer.assigned.add(TP0)
        await self._listener.on_partitions_assigned([TP0])

    async def getmany(self, **_: Any) -> dict[TopicPartition, list[Any]]:
        self.fetches += 1
        if self.fetches == 1:
            return {TP0: records(TP0, 7, 2)}
        decode(self._batch)
        raise AssertionError("decoded without cramjam")

    async def stop(self) -> None:
        self.stopped = True

    def __getattr__(self, name: str) -> Any:  # assignment, committed, seek, resume
        return getattr(self._rig.consumer, name)


async def test_exactly_once_stops_reading_commits_what_came_before_and_is_not_ready(
    without_cramjam: bytes, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    rig = Rig(monkeypatch, compression_type="none")  # zstd, the default, needs cramjam
    consumer = CodecConsumer(without_cramjam, rig)
    monkeypatch.setattr(clients, "AIOKafkaConsumer", lambda **_: consumer)
    running = asyncio.create_task(rig.worker.run())
    try:
        while rig.runner.blocked is None:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.7)  # more than a fetch's wait: it would have read again
        assert consumer.fetches == 2 and not running.done()  # alive, reading no further
        assert rig.producer(TP0).committed == [{TP0: 9}]  # the records read before, only
        assert not rig.worker.ready()
        assert "snappy" in rig.runner.blocked and "cramjam" in rig.runner.blocked
        lines = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(lines) == 1 and "snappy" in lines[0].getMessage()
    finally:
        rig.worker.stop()
        await asyncio.wait_for(running, 10)
        rig.runner.close()
    assert consumer.stopped


async def test_at_least_once_fetches_nothing_more_once_a_batch_cannot_be_decoded(
    without_cramjam: bytes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    fetches: list[int] = []

    async def faust_fetch(*_: Any, **__: Any) -> dict[TopicPartition, list[Any]]:
        fetches.append(1)
        return {TP0: decode(without_cramjam)}

    monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "_fetch_records", faust_fetch)
    runner = EventRunner(Settings(input_topic="in", compression_type="none"),
                         PolicyRegistry(Policy()), Metrics())
    thread = object.__new__(_ConsumerThread)  # the fetch alone, no thread nor consumer
    thread.app = type("App", (), {"runner": runner})()
    try:
        for _ in range(3):
            assert await thread._fetch_records(None, {TP0}, 0.01, None) == {}
        assert len(fetches) == 1  # no retry: the error lost what else that fetch read
        assert runner.blocked is not None and "snappy" in runner.blocked
    finally:
        runner.close()


class CodecTopicConsumer:
    """TopicReader's consumer, reading the snappy batch."""

    def __init__(self, batch: bytes) -> None:
        self._batch = batch

    def assign(self, tps: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        pass

    async def getmany(self, *_: Any, **__: Any) -> dict[TopicPartition, list[Any]]:
        return {TP0: decode(self._batch)}


async def test_a_reading_command_stops_with_the_same_reason(without_cramjam: bytes) -> None:
    reader = TopicReader(KafkaClients("127.0.0.1:9"))
    reader._consumer = CodecTopicConsumer(without_cramjam)
    with pytest.raises(Undecodable, match=r"snappy-compressed records of in: the cramjam"):
        async for _ in reader.read("in", [Span(0, 0, 3)]):
            pass


@pytest.mark.parametrize("codec_name", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_codec_is_a_setting(codec_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_COMPRESSION_TYPE", codec_name)
    settings = load_settings()
    assert settings.producer_compression == (None if codec_name == "none" else codec_name)


def test_an_unknown_codec_is_refused_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSEMBLER_COMPRESSION_TYPE", "brotli")
    with pytest.raises(SettingsError, match="ASSEMBLER_COMPRESSION_TYPE"):
        load_settings()


def test_a_codec_whose_library_is_missing_is_refused_at_start(
    without_cramjam: bytes, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ASSEMBLER_COMPRESSION_TYPE", "zstd")
    with pytest.raises(SettingsError, match=r"ASSEMBLER_COMPRESSION_TYPE \(--compression-type\): .*zstd needs the cramjam"):
        load_settings()
    monkeypatch.setenv("ASSEMBLER_COMPRESSION_TYPE", "gzip")  # the standard library's
    assert load_settings().compression_type == "gzip"
