"""Every cache the engine keeps across requests, by name, with its cap: one registry.

The engine is deterministic, not pure: the same event and policy always give the same bytes,
but it remembers what it learnt of popular texts (their token counts, word sets and passage
costs) from one request to the next, since recounting them is most of an assembly's cost.
No cached value depends on anything but the text it is keyed by, so none changes an output.

As tiktoken keeps its `ENCODINGS` in one dict, the caches are named here (`CACHES`), each
with its cap (in bytes; a few small ones in entries), so that an operator can size them
(`configure`) and a test can start from nothing (`reset`). The caches themselves live where
they are used and register here when made (`sized_cache`, `count_cache`,
`register_function_cache`). Two lazy loaders are not caches and are not listed:
`tokens.get_counter` keeps one counter per tokenizer (each counter's counts are the `tokens`
cache) and `guard` compiles one pattern on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar
from weakref import WeakSet

from context_assembler.engine.lru import COUNT_ENTRY_BYTES, BoundedCache, SizedCache

V = TypeVar("V")

MiB: Final = 2**20


class _FunctionCache(Protocol):
    """A `functools.lru_cache` wrapper, as far as the registry uses it."""

    def cache_clear(self) -> None: ...


@dataclass(slots=True)
class Registered:
    """One named cache: what it holds and its cap, in bytes where entries vary in size, else
    in entries of a bounded size; the live caches it names (one per tokenizer for `tokens`)."""

    holds: str
    max_bytes: int | None = None  # the caps an operator may set
    max_entries: int | None = None  # fixed: entries of a few hundred bytes at most
    _sized: WeakSet[SizedCache[Any, Any]] = field(default_factory=WeakSet)
    _functions: list[_FunctionCache] = field(default_factory=list)

    def clear(self) -> None:
        for cache in list(self._sized):
            cache.clear()
        for function in self._functions:
            function.cache_clear()


CACHES: Final[dict[str, Registered]] = {
    # About 20,000 texts, each with a sketch and a cost (under focused compression, also
    # its word forms: about 8,000 texts of 2 KB).
    "facts": Registered(
        "per chunk text: its word sketches, passage costs and word forms", 24 * MiB),
    # A 2 KB passage's entry is 20-30 KB: about 2,200 of them.
    "words": Registered("word sets of texts up to 4,096 characters", 56 * MiB),
    # An entry costs COUNT_ENTRY_BYTES whatever its text: about 175,000 texts per tokenizer.
    "tokens": Registered("token counts by text, per tokenizer (the cap is each one's)", 32 * MiB),
    "header_fields": Registered(
        "passage header fields of up to 200 characters, made one line", max_entries=16_384
    ),
    "validity": Registered("passage header validity phrases, by dates", max_entries=16_384),
    "question_words": Registered("the content words of the last question", max_entries=1),
    # A 130-token passage's entry is about 3 KB: about 10,000 of them.
    "sentences": Registered(
        "per passage text and tokenizer: its sentences, word forms and token counts "
        "(focused compression)", 32 * MiB),
    "word_forms": Registered("light word forms of words up to 32 characters", max_entries=65_536),
    "title_forms": Registered(
        "the word forms of chunk titles up to 200 characters (focused compression)",
        max_entries=4_096),
}


def _registered(name: str) -> Registered:
    registered = CACHES.get(name)
    if registered is None:
        raise ValueError(f"no engine cache is named {name!r}; choose one of {', '.join(CACHES)}")
    return registered


def _byte_cap(name: str) -> int:
    cap = _registered(name).max_bytes
    if cap is None:
        raise ValueError(f"engine cache {name!r} is bounded in entries, not bytes")
    return cap


def max_entries(name: str) -> int:
    """The entry bound of the cache registered as `name`, for its `functools.lru_cache`."""
    entries = _registered(name).max_entries
    if entries is None:
        raise ValueError(f"engine cache {name!r} is bounded in bytes, not entries")
    return entries


def sized_cache(name: str, size_of: Callable[[V], int]) -> SizedCache[Any, V]:
    """A new cache under the cap registered as `name`, sized and reset with the others."""
    cache: SizedCache[Any, V] = SizedCache(_byte_cap(name), size_of)
    _registered(name)._sized.add(cache)
    return cache


def count_cache(name: str) -> BoundedCache[int]:
    """A new cache of token counts under the cap registered as `name`."""
    # At least one entry, as `BoundedCache.resize` keeps: a cap under one entry's cost
    # still counts (and remembers the last text).
    cache: BoundedCache[int] = BoundedCache(max(1, _byte_cap(name) // COUNT_ENTRY_BYTES))
    _registered(name)._sized.add(cache)
    return cache


def register_function_cache(name: str, function: _FunctionCache) -> None:
    """Have `reset` clear the `functools.lru_cache` of `function` too."""
    _registered(name)._functions.append(function)


def configure(**byte_caps: int) -> None:
    """Set the byte caps of the named caches (e.g. `configure(words=128 * MiB)`): caches
    made from now on get them, and live ones shrink to them at once. Raises ValueError,
    changing nothing, for an unknown name, a cache bounded in entries, or a cap below 1."""
    for name, cap in byte_caps.items():
        _byte_cap(name)
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 1:
            raise ValueError(f"engine cache {name!r}: the cap must be a whole number of bytes >= 1")
    for name, cap in byte_caps.items():
        registered = CACHES[name]
        registered.max_bytes = cap
        for cache in list(registered._sized):
            cache.resize(cap)


def reset() -> None:
    """Empty every engine cache: the next assembly starts as in a fresh process."""
    for registered in CACHES.values():
        registered.clear()
