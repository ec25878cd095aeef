"""Compressed record batches decoded within a bound (kafka.batches), without a broker.

Each codec: a bomb is refused without allocating its size (tracemalloc's peak, which counts
the buffers decoded into), a valid batch decodes to what aiokafka's own decoder makes, and a
header that lies about the content size changes neither.
"""

from __future__ import annotations

import importlib
import inspect
import os
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiokafka
import cramjam
import pytest
import xxhash
from aiokafka import TopicPartition
from aiokafka import codec as aiokafka_codec
from aiokafka.consumer import fetcher
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import ConsumerRecord
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembler.contract.models import RejectReason
from context_assembler.kafka import batches
from context_assembler.kafka.batches import (
    TooLarge,
    guard,
    gzip_decode,
    lz4_decode,
    snappy_decode,
    zstd_decode,
)
from context_assembler.kafka.records import ERR, Origin, SkippedBatch, handle, header
from context_assembler.settings import Settings, load_settings
from tests.kafka.test_records import CONTEXT

MiB = 1024 * 1024
LIMIT = 4 * MiB
PREFIX = b'{"request_id": "bomb", "question": "'  # a bomb: a JSON prefix, then spaces
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
Decoder = Callable[[Any, int], bytearray]
DECODERS: dict[str, Decoder] = {"gzip": gzip_decode, "snappy": snappy_decode,
                                "lz4": lz4_decode, "zstd": zstd_decode}
ORIGINAL: dict[str, Callable[[Any], bytes]] = {
    "gzip": aiokafka_codec.gzip_decode, "snappy": aiokafka_codec.snappy_decode,
    "lz4": aiokafka_codec.lz4_decode, "zstd": aiokafka_codec.zstd_decode}
ENCODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": aiokafka_codec.gzip_encode, "snappy": aiokafka_codec.snappy_encode,
    "lz4": aiokafka_codec.lz4_encode, "zstd": aiokafka_codec.zstd_encode}


@pytest.fixture(autouse=True)
def unguarded() -> Iterator[None]:
    """Each test installs its own bound; aiokafka's decoders and fetcher are put back."""
    modules = [importlib.import_module(name) for name in batches.RECORD_MODULES]
    saved = [dict(vars(module)) for module in modules]
    records, results, installed = fetcher.MemoryRecords, fetcher.FetchResult, batches._installed
    limit = batches.read_ahead.limit
    batches._installed = None
    yield
    for module, names in zip(modules, saved, strict=True):
        for name in ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode"):
            if name in names:
                setattr(module, name, names[name])
    fetcher.MemoryRecords, fetcher.FetchResult, batches._installed = records, results, installed
    batches.read_ahead.limit = limit


def compressed_batch(codec: str, values: list[bytes], base_offset: int = 0) -> bytes:
    """A v2 record batch of `values`, compressed with `codec` as aiokafka's producer does."""
    builder = DefaultRecordBatchBuilder(2, CODEC_IDS[codec], 0, -1, -1, -1, batch_size=1 << 30)
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=1_700_000_000_000 + delta, key=b"k%d" % delta,
                       value=value, headers=[("h", b"v")])
    data = bytearray(builder.build())
    data[:8] = base_offset.to_bytes(8, "big")
    return bytes(data)


def payload(batch: bytes) -> bytes:
    """The compressed records of a v2 batch: what aiokafka hands its decoder."""
    return batch[61:]


def peak_while(call: Callable[[], object]) -> tuple[int, BaseException | None]:
    """Bytes allocated at most while `call` ran (Python's allocator, which bytearrays and
    bytes use), and what it raised."""
    tracemalloc.start()
    try:
        call()
        raised: BaseException | None = None
    except Exception as error:
        raised = error
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """256 MiB of spaces after a JSON prefix, compressed by each codec (snappy 64 MiB: it
    compresses spaces only 21-fold)."""
    return {codec: payload(compressed_batch(
        codec, [PREFIX + b" " * ((64 if codec == "snappy" else 256) * MiB)]))
        for codec in CODEC_IDS}


def test_aiokafka_decodes_with_its_c_extension_here() -> None:
    """The guard must cover the implementation in use: the C one, unless switched off."""
    if os.environ.get("AIOKAFKA_NO_EXTENSIONS"):
        pytest.skip("aiokafka's pure-Python records are in use")
    assert MemoryRecords.__module__ == "aiokafka.record._crecords.memory_records"


@pytest.mark.parametrize("codec", CODEC_IDS)
def test_a_bomb_is_refused_without_allocating_its_size(codec: str, bombs: dict[str, bytes]) -> None:
    peak, raised = peak_while(lambda: DECODERS[codec](bombs[codec], LIMIT))
    assert isinstance(raised, TooLarge), raised
    assert (raised.codec, raised.limit, raised.compressed) == (codec, LIMIT, len(bombs[codec]))
    assert peak < 3 * LIMIT, f"{codec}: {peak / MiB:.1f} MiB allocated to refuse it"


@pytest.mark.parametrize("codec", CODEC_IDS)
def test_a_batch_at_the_bound_decodes_and_one_byte_more_does_not(codec: str) -> None:
    data = os.urandom(64) + b"x" * (LIMIT - 64)
    compressed = ENCODERS[codec](data)
    assert bytes(DECODERS[codec](compressed, LIMIT)) == data
    with pytest.raises(TooLarge):
        DECODERS[codec](ENCODERS[codec](data + b"x"), LIMIT)


@pytest.mark.parametrize("codec", CODEC_IDS)
@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.binary(max_size=3000) | st.text(max_size=3000).map(str.encode),
                       max_size=20))
def test_a_valid_batch_decodes_as_aiokafka_decodes_it(codec: str, values: list[bytes]) -> None:
    """Byte-identical, or the same error (aiokafka's xerial snappy of nothing is 16 bytes
    of header it cannot decode)."""
    compressed = ENCODERS[codec](b"".join(values))
    assert _outcome(lambda: DECODERS[codec](compressed, LIMIT)) == _outcome(
        lambda: ORIGINAL[codec](compressed))


def _outcome(decode: Callable[[], bytes | bytearray]) -> tuple[str, bytes]:
    try:
        return "decoded", bytes(decode())
    except Exception as error:
        return "raised", str(error).encode()


def test_several_frames_and_members_decode_as_aiokafka_decodes_them() -> None:
    """zstd frames and gzip members one after another; xerial snappy blocks and raw."""
    parts = [os.urandom(5000), b"a" * 300_000, b"", b"tail"]
    samples = {
        "zstd": b"".join(bytes(cramjam.zstd.compress(p)) for p in parts),
        "gzip": b"".join(aiokafka_codec.gzip_encode(p) for p in parts),
        "snappy": aiokafka_codec.snappy_encode(b"".join(parts), xerial_blocksize=4096),
        "lz4": aiokafka_codec.lz4_encode(b"".join(parts)),
    }
    raw_snappy = aiokafka_codec.snappy_encode(b"".join(parts), xerial_compatible=False)
    for codec, compressed in [*samples.items(), ("snappy", raw_snappy)]:
        assert bytes(DECODERS[codec](compressed, LIMIT)) == ORIGINAL[codec](compressed), codec


def test_a_zstd_frame_decodes_whether_or_not_it_declares_its_size() -> None:
    data = os.urandom(1000) * 50
    streamed = cramjam.zstd.Compressor()
    streamed.compress(data)
    undeclared = bytes(streamed.finish())
    declared = bytes(cramjam.zstd.compress(data))
    assert batches.zstd_declared(undeclared) is None
    assert batches.zstd_declared(declared) == len(data)
    for compressed in (undeclared, declared):
        assert bytes(zstd_decode(compressed, LIMIT)) == data


def _zstd_with_declared(data: bytes, declared: int) -> bytes:
    """`data` in one zstd frame whose header declares `declared` bytes (8-byte field)."""
    frame = bytes(cramjam.zstd.compress(data))
    descriptor = frame[4]
    assert not descriptor & 0x03  # no dictionary id
    single_segment = descriptor & 0x20
    window = b"" if single_segment else frame[5:6]
    width = (1 if single_segment else 0, 2, 4, 8)[descriptor >> 6]
    body = frame[5 + len(window) + width:]
    return (frame[:4] + bytes([descriptor | 0xC0]) + window + declared.to_bytes(8, "little")
            + body)


def _lz4_with_declared(data: bytes, declared: int) -> bytes:
    """`data` in an lz4 frame whose header declares `declared` bytes, its checksum right."""
    frame = bytes(aiokafka_codec.lz4_encode(data))
    flags, block = frame[4] | 0x08, frame[5]
    descriptor = bytes([flags, block]) + declared.to_bytes(8, "little")
    checksum = (xxhash.xxh32_intdigest(descriptor) >> 8) & 0xFF
    return frame[:4] + descriptor + bytes([checksum]) + frame[7:]


@pytest.mark.parametrize("declare", [_zstd_with_declared, _lz4_with_declared])
def test_a_header_declaring_more_than_the_bound_is_refused_unread(
        declare: Callable[[bytes, int], bytes]) -> None:
    compressed = declare(b"small", 10 * LIMIT)
    peak, raised = peak_while(lambda: (zstd_decode if declare is _zstd_with_declared
                                       else lz4_decode)(compressed, LIMIT))
    assert isinstance(raised, TooLarge) and raised.declared == 10 * LIMIT
    assert peak < 64 * 1024


@pytest.mark.parametrize("declare", [_zstd_with_declared, _lz4_with_declared])
def test_a_header_declaring_less_than_a_bomb_holds_is_no_way_past_the_bound(
        declare: Callable[[bytes, int], bytes]) -> None:
    compressed = declare(PREFIX + b" " * (64 * MiB), 100)
    decode = zstd_decode if declare is _zstd_with_declared else lz4_decode
    peak, raised = peak_while(lambda: decode(compressed, LIMIT))
    assert isinstance(raised, TooLarge) and raised.declared is None
    assert peak < 3 * LIMIT


def test_snappy_blocks_declaring_more_than_the_bound_are_refused_before_any_is_decoded() -> None:
    compressed = aiokafka_codec.snappy_encode(b" " * (LIMIT + 1), xerial_blocksize=MiB)
    peak, raised = peak_while(lambda: snappy_decode(compressed, LIMIT))
    assert isinstance(raised, TooLarge) and raised.declared == LIMIT + 1
    assert peak < MiB


@pytest.mark.parametrize("codec", CODEC_IDS)
def test_guarded_aiokafka_reads_a_bomb_as_one_skipped_record_and_the_batch_after_it(
        codec: str) -> None:
    """Through aiokafka's own record classes (the C extension here), as its fetcher reads."""
    guard(LIMIT)
    bomb = compressed_batch(codec, [b"x" * (LIMIT + 1), b"y"], base_offset=40)
    after = compressed_batch(codec, [b"valid"], base_offset=42)
    records = fetcher.MemoryRecords(bomb + after)
    read = []
    while records.has_next():
        read.extend(records.next_batch())
    skipped, valid = read
    assert (skipped.offset, valid.offset, valid.value) == (41, 42, b"valid")
    value = skipped.value
    assert isinstance(value, SkippedBatch) and value == b""
    assert (value.first_offset, value.last_offset, value.codec, value.limit) == (
        40, 41, codec, LIMIT)


@pytest.mark.parametrize("codec", CODEC_IDS)
def test_guarded_aiokafka_reads_valid_batches_as_it_did(codec: str) -> None:
    values = [os.urandom(100), b"", b'{"a": 1}' * 1000, os.urandom(1) * 70_000]
    data = compressed_batch(codec, values, base_offset=7) + compressed_batch(codec, [b"z"], 11)

    def read(records: Any) -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = []
        while records.has_next():
            found.extend((r.offset, r.timestamp, r.key, r.value, r.headers)
                         for r in records.next_batch())
        return found

    before = read(MemoryRecords(data))
    guard(LIMIT)
    assert read(fetcher.MemoryRecords(data)) == before


def test_guard_replaces_the_decoders_aiokafka_calls_in_each_implementation() -> None:
    guard(LIMIT)
    for name in batches.RECORD_MODULES:
        module = importlib.import_module(name)
        for codec in ("gzip", "snappy", "lz4", "zstd"):
            decoder = getattr(module, f"{codec}_decode", None)
            if decoder is not None:
                assert decoder.func is DECODERS[codec] and decoder.keywords == {"limit": LIMIT}


def test_a_skipped_batch_becomes_a_limits_dead_letter_naming_its_offsets() -> None:
    value = SkippedBatch(first_offset=40, last_offset=41, codec="zstd", compressed_bytes=16_413,
                         limit=LIMIT, declared=512 * MiB)
    origin = Origin("in", 3, 41, None, (), 1_700_000_000_000)
    outcome = handle(value, origin, CONTEXT)
    assert outcome.rejected is not None and outcome.rejected.reason == RejectReason.LIMITS
    (letter,) = outcome.records
    assert (letter.topic, letter.key, letter.value) == ("dlq", None, b"")
    assert header(letter.headers, f"{ERR}topic") == b"in"
    assert header(letter.headers, f"{ERR}partition") == b"3"
    assert header(letter.headers, f"{ERR}offset") == b"41"
    message = header(letter.headers, f"{ERR}exception.message")
    assert message == (b"record batch at offsets 40-41 (zstd, 16413 bytes compressed) declares "
                       b"536870912 bytes, over max_batch_bytes=4194304: skipped unread")


def test_the_bound_holds_at_least_one_event_of_the_largest_size() -> None:
    assert Settings().max_batch_bytes >= Settings().max_event_bytes
    with pytest.raises(ValueError, match="ASSEMBLER_MAX_BATCH_BYTES"):
        load_settings({"max_batch_bytes": 2 * MiB, "max_event_bytes": 3 * MiB})


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_a_legacy_batch_bomb_is_skipped_too(codec: str) -> None:
    """Message format v1 (no broker from Kafka 4 serves it, but aiokafka still reads it)."""
    guard(LIMIT)
    bomb = LegacyRecordBatchBuilder(1, CODEC_IDS[codec], batch_size=1 << 30)
    bomb.append(0, timestamp=1000, key=b"k", value=b" " * (LIMIT + 1))
    bomb.append(1, timestamp=1001, key=b"k", value=b"x")
    valid = LegacyRecordBatchBuilder(1, CODEC_IDS[codec], batch_size=1 << 30)
    valid.append(2, timestamp=1002, key=b"k", value=b"valid")
    records = fetcher.MemoryRecords(bytes(bomb.build()) + bytes(valid.build()))
    read = []
    while records.has_next():
        read.extend(records.next_batch())
    skipped, after = read  # at its wrapper's offset (the last inner one, as a broker writes it)
    assert isinstance(skipped.value, SkippedBatch) and skipped.value.codec == codec
    assert (after.offset, after.value) == (2, b"valid")


def test_the_read_ahead_counts_a_record_until_it_is_freed() -> None:
    read_ahead = batches.ReadAhead(100)
    first = ConsumerRecord("t", 0, 0, 0, 0, b"k", b"v" * 59, None, 1, 59, [("h", b"x")])
    second = ConsumerRecord("t", 0, 1, 0, 0, None, b"w" * 40, None, -1, 40, [])
    read_ahead.track(first, batches.record_bytes(first))  # 1 + 59 + 2
    read_ahead.track(second, batches.record_bytes(second))
    assert (read_ahead.held, read_ahead.full) == (102, True)
    del first
    assert (read_ahead.held, read_ahead.full) == (40, False)
    del second
    assert read_ahead.held == 0


def test_a_fetch_call_hands_out_records_up_to_the_bound_and_the_rest_later() -> None:
    """Through aiokafka's consumer and fetcher, as a fetch of batches each under the bound
    but together far over it would be read: a call stops at the bound."""
    guard(LIMIT)
    data = b"".join(compressed_batch("zstd", [b" " * (LIMIT // 3)], base_offset=n)
                    for n in range(9))
    calls = _drain(data)
    assert [offset for call in calls for offset in call] == list(range(9))
    assert max(len(call) for call in calls) == 3  # a third of the bound each: three a call
    assert batches.read_ahead.held == 0  # all freed once read


class _Position:
    """aiokafka's view of an assigned partition, as a FetchResult asks it: active, not
    paused, at the position each call leaves it."""

    active, paused, position = True, False, 0

    def state_value(self, _: TopicPartition) -> _Position:
        return self

    def consumed_to(self, offset: int) -> None:
        self.position = offset


def _drain(data: bytes) -> list[list[int]]:
    """The offsets each call hands out of `data`, one fetch of partition t/0 from offset 0."""
    tp = TopicPartition("t", 0)
    records = fetcher.PartitionRecords(tp, fetcher.MemoryRecords(data), [], 0, None, None,
                                       False, fetcher.READ_UNCOMMITTED)
    result = fetcher.FetchResult(tp, assignment=_Position(), partition_records=records,
                                 backoff=0)
    del records
    calls = []
    while result.has_more():
        handed = result.getall(max_records=100)
        calls.append([record.offset for record in handed])
        del handed
    return calls


def test_a_rejection_keeps_no_frame_that_holds_its_event() -> None:
    """Its traceback's frames held the event's bytes in a cycle through the outcome."""
    outcome = handle(b"x" * 100, Origin("in", 0, 0, None, (), None), CONTEXT)
    assert outcome.rejected is not None and outcome.rejected.__traceback__ is None


def test_the_guard_names_the_aiokafka_it_was_read_against() -> None:
    """A new aiokafka pin in constraints.txt comes with a new reading of `batches`."""
    pinned = (Path(__file__).parents[2] / "constraints.txt").read_text().splitlines()
    assert f"aiokafka=={aiokafka.__version__}" in pinned
    assert "aiokafka 0.14" in inspect.getsource(batches)


def test_what_the_guard_relies_on_is_still_in_aiokafka() -> None:
    """The aiokafka internals `guard` replaces or calls, at every version pyproject allows."""
    for name in ("MemoryRecords", "FetchResult", "PartitionRecords"):
        assert hasattr(fetcher, name), name
    for name in ("getall", "check_assignment", "has_more", "_update_position"):
        assert hasattr(fetcher.FetchResult, name), name
    assert list(inspect.signature(fetcher.FetchResult.getall).parameters) == [
        "self", "max_records"]
    for name in batches.RECORD_MODULES[2:]:  # the pure-Python ones, always there
        module = importlib.import_module(name)
        assert hasattr(module, "gzip_decode") and hasattr(module, "lz4_decode"), name
