"""Bounded, thread-safe LRU caches whose size is accounted in bytes (`caches` names them).

Events are untrusted and a worker lives for weeks: a cache bounded only in entries grows
with the size of what it holds (15 events of 40 x 99 KB chunks once kept 776 MB alive). So
every entry is charged an approximate but honest byte cost, and the least recently used
entries go once the total passes the cap. The lock makes one cache safe to share between
worker threads and asyncio tasks (all engine calls are synchronous).

Texts are keyed by `text_key`, which does not keep the text. Event text is untrusted: a chunk
crafted to share another text's key would hand every request that renders that text the
chunk's counts, and budgets are checked on sums of cached counts (`count_parts`). xxh3-128
alone is fast and fine against chance collisions but not built to resist crafted ones, so
the key folds in this process's str hash, SipHash-1-3 under a random 128-bit key drawn at
start, which no event can learn: cached values are pure functions of the text, so none of
it reaches an output. Python caches that hash on the string, for the dicts that hash it
again. Paired on warm 20-chunk events it costs 3-4 % (17 us of 0.44 ms), a keyed blake2b
22 %; keeping texts to compare on a hit would cut what the caches hold 9-15-fold (1.5-2.6 KB
passages against a 192 B entry). Where str hashes are not random (PYTHONHASHSEED=0), the
key is a blake2b under a random key instead; a fixed non-zero PYTHONHASHSEED cannot be seen
from inside, so SECURITY.md says never to set it.
"""

from __future__ import annotations

import hashlib
import secrets
import sys
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

_LOW_64: Final = 2**64 - 1
_xxh3_128 = xxhash.xxh3_128_intdigest
# Whether `hash(str)` is SipHash under a random key for every string (no short-string cut-off).
STR_HASH_IS_KEYED: Final = (
    sys.flags.hash_randomization != 0
    and sys.hash_info.algorithm in ("siphash13", "siphash24")
    and sys.hash_info.cutoff == 0
)
_BLAKE2B_KEY: Final = secrets.token_bytes(16)


def _xxh3_and_str_hash(text: str) -> int:
    """128 bits of the text, the high 64 keyed by this process's secret str hash key."""
    return _xxh3_128(text.encode("utf-8", "surrogatepass")) ^ ((hash(text) & _LOW_64) << 64)


def _keyed_blake2b(text: str) -> int:
    """128 bits of the text under a random key: where the str hash key is knowable."""
    digest = hashlib.blake2b(
        text.encode("utf-8", "surrogatepass"), digest_size=16, key=_BLAKE2B_KEY
    ).digest()
    return int.from_bytes(digest, "little")


# A text's cache key: 128 bits that no event can aim at another text's (see above).
text_key: Final[Callable[[str], int]] = (
    _xxh3_and_str_hash if STR_HASH_IS_KEYED else _keyed_blake2b
)


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
            self._evict_over_cap()

    def resize(self, max_bytes: int) -> None:
        """Hold at most `max_bytes` from now on, evicting the least recently used at once."""
        if max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        with self._lock:
            self.max_bytes = max_bytes
            self._evict_over_cap()

    def _evict_over_cap(self) -> None:
        """The least recently used entries go until the rest fit; the lock is held."""
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
    """Small values (token counts) by text, keyed by its `text_key`.

    Popular chunks recur across requests; counting their tokens once is the main saving of
    the engine. Every entry costs `COUNT_ENTRY_BYTES`, whatever the length of its text, so
    `max_entries` bounds the bytes too: `max_bytes = max_entries * COUNT_ENTRY_BYTES`.
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        super().__init__(max_entries * COUNT_ENTRY_BYTES, _count_entry_bytes)
        self.max_entries = max_entries

    def resize(self, max_bytes: int) -> None:
        """Hold as many entries as `max_bytes` pays for, at least one."""
        self.max_entries = max(1, max_bytes // COUNT_ENTRY_BYTES)
        super().resize(self.max_entries * COUNT_ENTRY_BYTES)

    def get_or_compute(self, text: str, compute: Callable[[str], V]) -> V:
        key = text_key(text)
        value = self.get(key)
        if value is None:
            value = compute(text)  # outside the lock: tokenising may take milliseconds
            self.put(key, value)
        return value
