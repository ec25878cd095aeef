"""The registry of engine caches: every cache is named there, sized there, reset there."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Iterator

import pytest

import context_assembler.engine
from context_assembler.engine import assemble, caches, compress, facts, render, words
from context_assembler.engine.lru import COUNT_ENTRY_BYTES, BoundedCache, SizedCache
from context_assembler.engine.policy import Policy
from context_assembler.engine.tokens import TiktokenCounter, get_counter
from tests.factories import chunk, event

# Module globals that are functools caches but load once rather than remember event data.
LOADERS = {"context_assembler.engine.guard._symbol", "context_assembler.engine.tokens._tiktoken_counter"}


def engine_globals() -> Iterator[tuple[str, object]]:
    for module in pkgutil.iter_modules(context_assembler.engine.__path__):
        name = f"context_assembler.engine.{module.name}"
        for attribute, value in vars(importlib.import_module(name)).items():
            yield f"{name}.{attribute}", value


def registered_sized() -> list[SizedCache[object, object]]:
    return [cache for entry in caches.CACHES.values() for cache in entry._sized]


@pytest.fixture
def default_caps() -> Iterator[None]:
    defaults = {name: c.max_bytes for name, c in caches.CACHES.items() if c.max_bytes is not None}
    yield
    caches.configure(**defaults)


def test_every_engine_cache_is_registered() -> None:
    """A cache made as a module global anywhere in the engine must be in the registry."""
    sized = [cache for _, cache in engine_globals() if isinstance(cache, SizedCache)]
    functions = {
        name: value for name, value in engine_globals()
        if hasattr(value, "cache_info") and not isinstance(value, type) and name not in LOADERS
    }
    assert sized and functions
    assert all(any(cache is known for known in registered_sized()) for cache in sized)
    registered = [f for entry in caches.CACHES.values() for f in entry._functions]
    unregistered = [name for name, f in functions.items() if not any(f is r for r in registered)]
    assert unregistered == []
    assert isinstance(get_counter("cl100k_base"), TiktokenCounter)
    assert any(get_counter("cl100k_base").cache is c for c in registered_sized())  # type: ignore[attr-defined]


def test_every_cache_has_a_cap() -> None:
    for name, entry in caches.CACHES.items():
        assert (entry.max_bytes is None) != (entry.max_entries is None), name
        assert entry.holds
    assert facts.FACTS.max_bytes == caches.CACHES["facts"].max_bytes
    assert words.CACHE.max_bytes == caches.CACHES["words"].max_bytes
    assert render._one_line_short.cache_info().maxsize == caches.CACHES["header_fields"].max_entries


def test_reset_empties_every_cache_and_changes_no_output() -> None:
    request = event([chunk(f"c{i}", f"Pump {i} needs oil every {i} months.", doc_id=f"d{i}")
                     for i in range(5)], question="How often does a pump need oil?")
    first = assemble(request, Policy())
    compress.extract_relevant("One. Two.", "pump?", 1)
    assert all(len(cache) for cache in (facts.FACTS, words.CACHE, get_counter("cl100k_base").cache))  # type: ignore[attr-defined]
    caches.reset()
    assert [len(cache) for cache in registered_sized()] == [0] * len(registered_sized())
    assert render._one_line_short.cache_info().currsize == 0
    assert render._validity.cache_info().currsize == 0
    assert compress._question_words.cache_info().currsize == 0
    assert assemble(request, Policy()) == first


def test_configure_shrinks_live_caches_and_sizes_new_ones(default_caps: None) -> None:
    request = event([chunk(f"c{i}", f"Valve {i} is checked yearly." * 20, doc_id=f"d{i}")
                     for i in range(30)])
    assemble(request, Policy())
    counts = get_counter("cl100k_base").cache  # type: ignore[attr-defined]
    assert len(counts) > 3
    caches.configure(tokens=3 * COUNT_ENTRY_BYTES + 5, facts=2_000)
    assert (counts.max_entries, len(counts)) == (3, 3)
    assert facts.FACTS.max_bytes == 2_000 >= facts.FACTS.nbytes
    later = caches.count_cache("tokens")
    assert later.max_entries == 3
    caches.configure(tokens=1)  # less than an entry: one entry still
    assert later.max_entries == counts.max_entries == 1


@pytest.mark.parametrize(("caps", "message"), [
    ({"nonsense": 10}, "no engine cache is named 'nonsense'"),
    ({"header_fields": 10}, "bounded in entries"),
    ({"words": 0}, "whole number of bytes"),
    ({"facts": 10, "words": -1}, "whole number of bytes"),
])
def test_configure_rejects_bad_caps_and_changes_nothing(
    caps: dict[str, int], message: str, default_caps: None
) -> None:
    before = {name: entry.max_bytes for name, entry in caches.CACHES.items()}
    with pytest.raises(ValueError, match=message):
        caches.configure(**caps)
    assert {name: entry.max_bytes for name, entry in caches.CACHES.items()} == before
    assert facts.FACTS.max_bytes == before["facts"]


def test_a_resized_cache_evicts_the_least_recently_used() -> None:
    cache: SizedCache[str, str] = SizedCache(12, len)
    for key in "abc":
        cache.put(key, key * 4)
    assert cache.get("a") == "aaaa"  # b is now the least recently used
    cache.resize(8)
    assert (cache.get("b"), cache.get("c"), cache.get("a"), cache.nbytes) == (None, "cccc", "aaaa", 8)
    with pytest.raises(ValueError, match="at least 1"):
        cache.resize(0)
    counts: BoundedCache[int] = BoundedCache(4)
    counts.resize(2 * COUNT_ENTRY_BYTES)
    assert (counts.max_entries, counts.max_bytes) == (2, 2 * COUNT_ENTRY_BYTES)


def test_function_caches_register_by_name_only() -> None:
    with pytest.raises(ValueError, match="no engine cache is named"):
        caches.register_function_cache("typo", functools.lru_cache(maxsize=1)(len))


def test_entry_bounds_are_read_from_the_registry() -> None:
    assert caches.max_entries("question_words") == compress._question_words.cache_info().maxsize == 1
    with pytest.raises(ValueError, match="bounded in bytes"):
        caches.max_entries("words")
