"""What the engine learns of a chunk text once and reuses across requests: its word sketch
(per title left out), its passage costs (per rendering) and, for focused compression, the
word forms it holds.

Popular chunks recur in request after request, and a large event drops most of its chunks
after only these two questions: is it a copy of a kept passage (its sketch), and what would
it cost (its rendering's tokens). So everything known of a text is one cache entry, keyed
by `cache.text_key` and found once, when the chunk becomes a `Candidate`: one look-up per
chunk instead of one per question.

An entry holds the header fields and title each answer was made with and compares them on
a hit instead of hashing them (each request's strings are new objects, and hashing them
cost more than the rest of a look-up). One text may recur under other fields or titles,
the same paragraph in two documents: an entry keeps up to MAX_VARIANTS answers of each
kind, newest first, so the copies do not evict each other request after request. Entries
are immutable tuples: a new answer makes a new entry, put under the same key, so threads
sharing the cache never see one half-made and its bytes are accounted exactly.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Final, NamedTuple

from context_assembler.engine import caches
from context_assembler.engine.words import Sketch

if TYPE_CHECKING:
    from context_assembler.engine.lru import SizedCache

MAX_VARIANTS: Final = 4  # answers of each kind per text: a few documents sharing it
# An entry's own cost besides its answers: its 128-bit int key, the TextFacts tuple and its
# two variant tuples, the OrderedDict slot and node (rounded up).
_ENTRY_BYTES: Final = 320
# A cost's own cost besides its header fields: its tuple, the rendering tuple, the count.
_COST_BYTES: Final = 192

Fields = tuple[object, ...]
# How a passage is rendered, besides its header fields: the tokenizer's name, the header
# style, and the label all passages share (None where each is labelled by its chunk_id).
Rendering = tuple[str, str, str | None]


class PassageCost(NamedTuple):
    """The tokens of a text rendered as a passage, and what the header was made of."""

    rendering: Rendering
    fields: Fields
    tokens: int
    nbytes: int


class TextFacts(NamedTuple):
    sketches: tuple[Sketch, ...]  # by title, newest first
    costs: tuple[PassageCost, ...]  # by rendering and header fields, newest first
    nbytes: int  # what holding the entry costs, approximately
    # the text's word forms, each between line breaks ("\nform\n" in it: the text holds
    # it), or None until focusing first asks: a string costs a tenth of a set of them
    terms: str | None = None


NOTHING_KNOWN: Final = TextFacts((), (), _ENTRY_BYTES)


def _entry_bytes(facts: TextFacts) -> int:
    return facts.nbytes


FACTS: Final[SizedCache[int, TextFacts]] = caches.sized_cache("facts", _entry_bytes)


def known(key: int) -> TextFacts:
    """What is known of the text whose `text_key` is `key`."""
    return FACTS.get(key) or NOTHING_KNOWN


def _remember(
    key: int, sketch: Sketch | None = None, cost: PassageCost | None = None,
    terms: str | None = None,
) -> TextFacts:
    """The entry of `key` with `sketch` or `cost` first among its kind, in place of any
    answer to the same question, or with its `terms`, held from now on. Read afresh:
    another candidate of the text (a copy in the same event) may have added an answer
    meanwhile."""
    facts = known(key)
    sketches, costs = facts.sketches, facts.costs
    terms = facts.terms if terms is None else terms
    if sketch is not None:
        sketches = (sketch, *(s for s in sketches if s.title != sketch.title))
    if cost is not None:
        costs = (cost, *(
            c for c in costs if (c.rendering, c.fields) != (cost.rendering, cost.fields)
        ))
    sketches, costs = sketches[:MAX_VARIANTS], costs[:MAX_VARIANTS]
    nbytes = (
        _ENTRY_BYTES + sum(s.nbytes for s in sketches) + sum(c.nbytes for c in costs)
        + (sys.getsizeof(terms) if terms is not None else 0)
    )
    facts = TextFacts(sketches, costs, nbytes, terms)
    FACTS.put(key, facts)
    return facts


def remember_sketch(key: int, made: Sketch) -> TextFacts:
    """The facts of the text `key` from now on: its sketches include `made`."""
    return _remember(key, sketch=made)


def passage_cost(facts: TextFacts, rendering: Rendering, fields: Fields) -> int | None:
    """The tokens of the text rendered under `rendering` with header `fields`, if known."""
    for found in facts.costs:
        if found.rendering == rendering and found.fields == fields:
            return found.tokens
    return None


def remember_cost(key: int, rendering: Rendering, fields: Fields, tokens: int) -> TextFacts:
    """The facts of the text `key` from now on: `passage_cost` answers `tokens`."""
    strings = [part for part in (*rendering, *fields) if isinstance(part, str)]
    nbytes = _COST_BYTES + sys.getsizeof(fields) + sum(map(sys.getsizeof, strings))
    return _remember(key, cost=PassageCost(rendering, fields, tokens, nbytes))


def remember_terms(key: int, terms: str) -> TextFacts:
    """The facts of the text `key` from now on: its word forms are `terms`."""
    return _remember(key, terms=terms)
