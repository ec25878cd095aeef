"""Bounded, thread-safe LRU caches whose size is accounted in bytes.

Events are untrusted and a worker lives for weeks: a cache bounded only in entries grows
with the size of what it holds (15 events of 40 x 99 KB chunks once kept 776 MB alive). So
every entry is charged an approximate but honest byte cost, and the least recently used
entries go once the total passes the cap. The lock makes one cache safe to share between
worker threads and asyncio tasks (all engine calls are synchronous).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Final, Generic, TypeVar

import xxhash

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# One OrderedDict entry of a 128-bit int key and a small int value: the key (48 B), the value
# (32 B), the dict slot and the ordering node, with the table's growth amortised. Measured
# with tracemalloc at 185 B per entry over 100,000 entries.
COUNT_ENTRY_BYTES: Final = 192


def text_key(text: str) -> int:
    """128 bits of the text: collisions are negligible, and the text itself is not kept."""
    return int(xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass")))


class SizedCache(Generic[K, V]):
    """An LRU holding at most `max_bytes`, each entry costing `size_of(value)` bytes."""

    def __init__(self, max_bytes: int, size_of: Callable[[V], int]) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0  # the accounted size of what is held now
        self.hits = 0
        self.misses = 0

    def get(self, key: K) -> V | None:
        """A hit takes no lock (it would triple the cost of a hit): each OrderedDict call is
        atomic under the GIL for keys of str, int and tuples of them, and an entry evicted
        between the two calls is still a right answer. Under contention the counters may
        miss an increment; they are statistics."""
        entries = self._entries
        value = entries.get(key)
        if value is None:
            self.misses += 1
            return None
        try:  # noqa: SIM105 - contextlib.suppress would cost more than the rest of a hit
            entries.move_to_end(key)
        except KeyError:  # evicted by another thread meanwhile
            pass
        self.hits += 1
        return value

    def put(self, key: K, value: V) -> None:
        """Hold `value`, evicting the least recently used entries to stay under the cap.

        A value larger than the whole cap is not held: it would only flush the others.
        """
        size = self._size_of(value)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:  # another thread computed it too
                self.nbytes -= self._size_of(old)
            self._entries[key] = value
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                self.nbytes -= self._size_of(self._entries.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = self.hits = self.misses = 0


def _count_entry_bytes(_: object) -> int:
    return COUNT_ENTRY_BYTES


class BoundedCache(SizedCache[int, V]):
    """Small values (token counts) by text, keyed by a 128-bit hash of the text.

    Popular chunks recur across requests; counting their tokens once is the main saving of
    the engine. Every entry costs `COUNT_ENTRY_BYTES`, whatever the length of its text, so
    `max_entries` bounds the bytes too: `max_bytes = max_entries * COUNT_ENTRY_BYTES`.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        super().__init__(max_entries * COUNT_ENTRY_BYTES, _count_entry_bytes)
        self.max_entries = max_entries

    def get_or_compute(self, text: str, compute: Callable[[str], V]) -> V:
        key = text_key(text)
        value = self.get(key)
        if value is None:
            value = compute(text)  # outside the lock: tokenising may take milliseconds
            self.put(key, value)
        return value
