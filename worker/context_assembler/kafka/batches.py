"""Compressed record batches decoded within a bound, or skipped unread.

aiokafka decompresses a whole record batch in one call before any record of it is looked
at, and a batch of a few kilobytes on the broker (the topic's max.message.bytes and the
fetch sizes bound only compressed bytes) can decompress to gigabytes: a worker killed for
its memory reads the same batch when restarted, and its partition never moves again.

`guard` installs bounded decoders at the one place aiokafka decompresses a batch (the
`*_decode` functions its record modules call, the C extension's and the pure-Python ones
alike), so no batch is decoded to more than `max_batch_bytes`:

- zstd and lz4 frames may declare their content size: a batch declaring more is refused
  before anything is decoded; then (the header may lie or be absent) the batch is decoded
  into a buffer of a given size, which the decoder stops at, grown up to the bound;
- gzip is read by the standard library, as aiokafka reads it, a chunk at a time;
- snappy (raw, or xerial's blocks) declares each block's length: their sum is checked
  before any block is decoded.

A batch that would decompress beyond the bound reaches the consumer as one record, at the
batch's last offset, whose value is a `SkippedBatch` (so offsets after it are read and
committed as usual): the worker and replay dead-letter it with reason `limits`, the other
readers report it as they report records they skip.

Batches each under the bound still add up: the worker reads ahead of the engine, and forty
batches of a 30 MiB record each (a kilobyte apiece on the broker) were held at once. So the
records aiokafka hands out are counted until they are freed (`ReadAhead`), a fetch call
hands out at most the bound's worth (`BoundedFetchResult`), and the worker fetches no more
while events are in flight and the records alive hold the bound.
"""

from __future__ import annotations

import gzip
import importlib
import io
import itertools
import struct
import threading
import weakref
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, Final

from aiokafka.codec import _detect_xerial_stream
from aiokafka.consumer import fetcher
from aiokafka.record.memory_records import MemoryRecords

from context_assembler.kafka.records import SkippedBatch
from context_assembler.settings import DEFAULT_MAX_BATCH_BYTES

Buffer = bytes | bytearray | memoryview
# The first buffer a batch without a declared size is decoded into: its compressed size
# times this (JSON compresses 3-10 times), grown by GROWTH while the decoder fills it.
FIRST_GUESS: Final = 8
GROWTH: Final = 4
LEAST_BUFFER: Final = 64 * 1024
GZIP_CHUNK: Final = 1024 * 1024
# Where aiokafka's record batches call the decoders: its C extension (used unless
# AIOKAFKA_NO_EXTENSIONS is set) and its pure-Python modules.
RECORD_MODULES: Final = (
    "aiokafka.record._crecords.default_records",
    "aiokafka.record._crecords.legacy_records",
    "aiokafka.record.default_records",
    "aiokafka.record.legacy_records",
)
_ZSTD_MAGIC = 0xFD2FB528
_LZ4_MAGIC = 0x184D2204
# What cramjam's decoders say when they stopped at the end of the buffer given.
_FULL = ("failed to write whole buffer", "Destination buffer is too small")


def _cramjam() -> Any:
    """aiokafka's codec extras, which decode snappy, lz4 and zstd. An image without them never
    calls those decoders: aiokafka refuses such a batch first (kafka.codecs)."""
    return importlib.import_module("cramjam")


class TooLarge(Exception):
    """A batch decompresses to more than the bound (or declares it would)."""

    def __init__(self, codec: str, compressed: int, limit: int,
                 declared: int | None = None) -> None:
        super().__init__(codec, compressed, limit, declared)
        self.codec = codec
        self.compressed = compressed
        self.limit = limit
        self.declared = declared


def zstd_declared(data: Buffer) -> int | None:
    """The content size a zstd frame's header declares, or None (no frame, no size)."""
    head = bytes(data[:18])
    if len(head) < 6 or int.from_bytes(head[:4], "little") != _ZSTD_MAGIC:
        return None
    descriptor = head[4]
    size_flag, single_segment, dictionary_flag = descriptor >> 6, descriptor >> 5 & 1, \
        descriptor & 3
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dictionary_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[size_flag]
    if width == 0 or len(head) < position + width:
        return None
    size = int.from_bytes(head[position:position + width], "little")
    return size + 256 if width == 2 else size


def lz4_declared(data: Buffer) -> int | None:
    """The content size an lz4 frame's header declares, or None."""
    head = bytes(data[:14])
    if len(head) < 14 or int.from_bytes(head[:4], "little") != _LZ4_MAGIC:
        return None
    if not head[4] & 0x08:  # FLG's content size bit
        return None
    return int.from_bytes(head[6:14], "little")


def _decode_into(codec: str, decode: Callable[[Buffer, bytearray], int], data: Buffer,
                 limit: int, declared: int | None) -> bytearray:
    """`data` decoded by `decode` into a buffer the size it declares, or a guess, grown
    while the decoder fills it, never past `limit` (one byte more tells it is over)."""
    if declared is not None and declared > limit:
        raise TooLarge(codec, len(data), limit, declared)
    size = min(limit, declared if declared is not None
               else max(FIRST_GUESS * len(data), LEAST_BUFFER))
    while True:
        out = bytearray(size + 1)
        try:
            written = decode(data, out)
        except _cramjam().DecompressionError as error:
            if not any(full in str(error) for full in _FULL):
                raise
            written = size + 1
        if written <= size:
            del out[written:]
            return out
        del out
        if size >= limit:
            raise TooLarge(codec, len(data), limit)  # whatever its header said
        size = min(limit, size * GROWTH)


def zstd_decode(data: Buffer, limit: int) -> bytearray:
    return _decode_into("zstd", _cramjam().zstd.decompress_into, data, limit,
                        zstd_declared(data))


def lz4_decode(data: Buffer, limit: int) -> bytearray:
    return _decode_into("lz4", _cramjam().lz4.decompress_into, data, limit, lz4_declared(data))


def gzip_decode(data: Buffer, limit: int) -> bytearray:
    """As aiokafka decodes gzip (the standard library's GzipFile), a chunk at a time."""
    out = bytearray()
    with gzip.GzipFile(fileobj=io.BytesIO(data), mode="r") as stream:
        while chunk := stream.read1(min(GZIP_CHUNK, limit + 1 - len(out))):
            out += chunk
            if len(out) > limit:
                raise TooLarge("gzip", len(data), limit)
    return out


def snappy_decode(data: Buffer, limit: int) -> bytearray:
    """As aiokafka decodes snappy (raw, or in xerial's blocks), each block's declared
    length summed and checked before any is decoded."""
    view = memoryview(data)
    blocks = [view]
    if _detect_xerial_stream(view):
        blocks, cursor = [], 16
        while cursor < len(view):
            block_size = struct.unpack_from("!i", view, cursor)[0]
            cursor += 4
            blocks.append(view[cursor:cursor + block_size])
            cursor += block_size
    snappy = _cramjam().snappy
    lengths = [snappy.decompress_raw_len(block) for block in blocks]
    if sum(lengths) > limit:
        raise TooLarge("snappy", len(view), limit, sum(lengths))
    out = bytearray(sum(lengths))
    target = memoryview(out)
    for block, length in zip(blocks, lengths, strict=True):
        snappy.decompress_raw_into(block, target[:length])
        target = target[length:]
    target.release()
    return out


class _Skipped:
    """What aiokafka's fetcher reads of a batch skipped unread: one record at its last
    offset (so the batch's offsets are consumed and committed past) valued `SkippedBatch`."""

    key = None
    checksum = None

    def __init__(self, batch: Any, error: TooLarge) -> None:
        self.offset: int = batch.next_offset - 1
        base = getattr(batch, "base_offset", None)
        timestamp = getattr(batch, "max_timestamp", -1)
        self.timestamp = None if timestamp == -1 else timestamp
        self.timestamp_type = (None if self.timestamp is None
                               else getattr(batch, "timestamp_type", None))
        self.headers: list[tuple[str, bytes]] = []
        self.value = SkippedBatch(
            first_offset=self.offset if base is None else base, last_offset=self.offset,
            codec=error.codec, compressed_bytes=error.compressed, limit=error.limit,
            declared=error.declared)


class _GuardedBatch:
    """A compressed batch whose iteration (where aiokafka decompresses it) yields one
    `_Skipped` record instead of raising when it decompresses beyond the bound."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)

    def __iter__(self) -> Iterator[Any]:
        try:
            records: Iterator[Any] = iter(self._batch)  # a v2 batch decompresses here
            if not hasattr(self._batch, "compression_type"):  # a v0/v1 one on its first record
                records = itertools.chain((next(records),), records)
        except StopIteration:
            return iter(())
        except TooLarge as error:
            return iter((_Skipped(self._batch, error),))
        return records


class GuardedRecords:
    """aiokafka's MemoryRecords (one partition's fetched bytes), its compressed batches
    guarded: what the fetcher builds in its place once `guard` ran."""

    def __init__(self, data: bytes) -> None:
        self._records = MemoryRecords(data)

    def size_in_bytes(self) -> int:
        return int(self._records.size_in_bytes())

    def has_next(self) -> bool:
        return bool(self._records.has_next())

    def next_batch(self) -> Any:
        batch = self._records.next_batch()
        if batch is None or not getattr(batch, "compression_type", 1):
            return batch
        return _GuardedBatch(batch)


class ReadAhead:
    """Bytes of the records read and still alive (keys, values and headers), against a
    bound: a consumer fetches no more while they are at it. Each record is counted from
    when aiokafka hands it out until it is freed, and whatever holds it (a faust message,
    a batch in flight) counts for as long as it lives, so no path can forget to give its
    bytes back: records a rebalance drops from faust's buffers are freed with them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()  # faust's consumer thread hands records out

    @property
    def held(self) -> int:
        return self._held

    @property
    def full(self) -> bool:
        return self._held >= self.limit

    def track(self, owner: object, size: int) -> None:
        """Count `size` bytes until `owner` is freed."""
        with self._lock:
            self._held += size
        weakref.finalize(owner, self._release, size)

    def _release(self, size: int) -> None:
        with self._lock:
            self._held -= size


def record_bytes(record: Any) -> int:
    """What a consumed record holds: its key, value and headers."""
    size = len(record.key or b"") + len(record.value or b"")
    return size + sum(len(name) + len(value or b"") for name, value in record.headers or ())


read_ahead = ReadAhead(DEFAULT_MAX_BATCH_BYTES)


class BoundedFetchResult(fetcher.FetchResult):  # type: ignore[misc]
    """aiokafka's records of one partition fetched, handed out at most `read_ahead.limit`
    bytes a call (and at least one record): a fetch of many batches just under the bound
    would otherwise come out whole in one call."""

    # aiokafka 0.14's FetchResult.getall, with the bytes counted (and tracked).
    def getall(self, max_records: int | None = None) -> list[Any]:
        if not self.check_assignment(self._topic_partition) or not self.has_more():
            return []
        records: list[Any] = []
        size = 0
        partition_records: Iterator[Any] = vars(self)["_partition_records"]
        for record in partition_records:
            records.append(record)
            taken = record_bytes(record)
            read_ahead.track(record, taken)
            size += taken
            if ((max_records is not None and len(records) >= max_records)
                    or size >= read_ahead.limit):
                self._update_position()
                break
        else:
            self._update_position()
            self._partition_records = None
        return records


_installed: int | None = None


def guard(max_batch_bytes: int | None = None) -> None:
    """Bound every batch aiokafka decompresses in this process, and the bytes a fetch call
    hands out, to `max_batch_bytes` (None: as installed already, else the default).
    Idempotent; a later call sets a new bound. aiokafka 0.14's internals this replaces are
    checked to exist by tests/kafka/test_batches.py."""
    global _installed
    limit = max_batch_bytes or _installed or DEFAULT_MAX_BATCH_BYTES
    if limit == _installed:
        return
    decoders = {"gzip_decode": gzip_decode, "snappy_decode": snappy_decode,
                "lz4_decode": lz4_decode, "zstd_decode": zstd_decode}
    for name in RECORD_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # aiokafka installed without its C extension
            continue
        for attribute, decode in decoders.items():
            if hasattr(module, attribute):
                setattr(module, attribute, partial(decode, limit=limit))
    fetcher.MemoryRecords = GuardedRecords
    fetcher.FetchResult = BoundedFetchResult
    read_ahead.limit = limit
    _installed = limit
