"""A bounded, thread-safe LRU cache keyed by a 128-bit hash of the text.

Popular chunks recur across requests; counting their tokens once is the main saving of the
engine, and keys of 128 bits keep the texts themselves out of memory. The lock makes one
cache safe to share between worker threads and asyncio tasks (all engine calls are
synchronous).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

import xxhash

V = TypeVar("V")


def text_key(text: str) -> int:
    return int(xxhash.xxh3_128_intdigest(text.encode("utf-8", "surrogatepass")))


class BoundedCache(Generic[V]):
    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._entries: OrderedDict[int, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get_or_compute(self, text: str, compute: Callable[[str], V]) -> V:
        key = text_key(text)
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return value
        value = compute(text)  # outside the lock: tokenising may take milliseconds
        with self._lock:
            self.misses += 1
            self._entries[key] = value
            if len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0
