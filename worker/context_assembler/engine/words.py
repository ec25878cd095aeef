"""Word sets for near-duplicate detection (seed 000: lower-cased \\w+ words).

A passage often starts with its document's title ("PW-2400 care guide"); leaving that line
out keeps two equal paragraphs of two guides equal. By default (`drop_title_line = "title"`)
it is left out only when it is the title: when its words are exactly the words of the
chunk's `title`. Any other first line (an FAQ's answer, a heading of its own) is content and
counts. Seed 000 leaves the first line out always (`"always"`), whatever the title field says.

Word sets of short texts are cached per (text, line left out), bounded in accounted bytes; longer
texts are rare, costly to hold and cheap to split again in linear time, so they are not
cached at all.

A word set of a 2 KB passage costs 20-30 KB to hold, so the cache holds a few thousand: too
few for a 1,000-chunk event. Most comparisons need far less: a `Sketch` (the set's size, its
numbers and a 256-bit signature, under 1 KB) rules out nearly every pair exactly, and the
full sets are looked at only for the pairs it cannot rule out.
"""

from __future__ import annotations

import re
import sys
from itertools import filterfalse
from typing import Final, Literal, NamedTuple

from context_assembler.contract.models import Chunk
from context_assembler.engine import caches
from context_assembler.engine.lru import SizedCache
from context_assembler.engine.policy import TitleLineRule

WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
WORD_CACHE_MAX_CHARS: Final = 4096  # longer texts are split again on every use
# Besides the sets, strings and key text: the OrderedDict slot and node, the key tuple, the
# Words tuple, its size int and its signature (about 310 B together).
_ENTRY_BYTES: Final = 320
# A word is a str of its own: a header (49 B in ASCII, up to 76 B otherwise, rounded up by
# the allocator) and its characters, which all fit in the text it came from.
_ASCII_WORD_BYTES, _WORD_BYTES = 56, 80
# In ASCII text \w is [A-Za-z0-9_]: blanking every other character and splitting on spaces
# finds the same words as WORD, about three times faster.
_BLANK_NON_WORD = str.maketrans(
    dict.fromkeys((c for c in map(chr, range(128)) if not (c.isalnum() or c == "_")), " ")
)


# A sketch's own cost besides its numbers' strings: the Sketch tuple and its ints (the
# signature is 60 B), rounded up; `facts` charges the cache entry that holds it.
_SKETCH_ENTRY_BYTES: Final = 224
SIGNATURE_BITS: Final = 256
_BIT: Final = tuple(1 << bit for bit in range(SIGNATURE_BITS))


# What leaves a chunk's first line out of its words: the title that line must match, True
# (whatever it says), or None (never).
LeftOut = str | Literal[True] | None


def left_out(title: str | None, rule: TitleLineRule) -> LeftOut:
    """What leaves the first line of a chunk titled `title` out under `rule`."""
    if rule == "always":
        return True
    return title if rule == "title" else None


class Words(NamedTuple):
    """The distinct words a near-duplicate test compares, and which of them hold a digit."""

    all: frozenset[str]
    numbers: frozenset[str]
    nbytes: int  # what holding this entry in the cache costs, approximately
    signature: int  # see `signature`


class Sketch(NamedTuple):
    """What rules most pairs out without the word sets: their sizes, their numbers, and
    their signatures (`signature_slack`)."""

    size: int
    numbers: frozenset[str]
    signature: int
    nbytes: int
    title: LeftOut  # what leaves the first line out (`left_out`)


def signature(found: frozenset[str]) -> int:
    """One bit per word, at the word's hash: this process's str hash, as signatures are
    only compared within the process, and unless PYTHONHASHSEED is fixed no event can aim
    its words at one bit (which would only make the test rule less out, never wrongly)."""
    return sum(map(_BIT.__getitem__, {hash(word) & (SIGNATURE_BITS - 1) for word in found}))


def signature_slack(least: float) -> float:
    """`f` such that two word sets of Jaccard similarity >= `least` (> -1) have signatures
    that differ in at most (|a| + |b|) * f + 0.5 bits: more rules the pair out, exactly.

    A bit set in one signature only is set by a word the other set lacks, so the bits the
    signatures differ in are at most the words the sets differ in, |a ^ b|; and Jaccard
    J means |a ^ b| = (|a| + |b|)(1 - J) / (1 + J). The half bit covers float rounding.
    """
    return (1 - least) / (1 + least)


def words(text: str) -> list[str]:
    """The lower-cased \\w+ words of `text`, in order."""
    lowered = text.lower()
    if lowered.isascii():
        return lowered.translate(_BLANK_NON_WORD).split()
    return WORD.findall(lowered)


def _body(text: str, title: LeftOut) -> str:
    """`text` without its first line if `title` leaves it out: always (True), or when the
    line is the title (same words, same order)."""
    if title is None:
        return text
    first, newline, rest = text.partition("\n")
    if not newline:
        return text
    return rest if title is True or words(first) == words(title) else text


def _words_of(text: str, title: LeftOut) -> Words:
    body = _body(text, title)
    found = frozenset(words(body))
    # str.isalpha clears most words at C speed before the regex looks for a digit.
    numbers = frozenset(w for w in filterfalse(str.isalpha, found) if _DIGIT.search(w))
    strings = (
        len(found) * _ASCII_WORD_BYTES + len(body)
        if body.isascii()
        else len(found) * _WORD_BYTES + 4 * len(body)
    )
    nbytes = (
        _ENTRY_BYTES
        + sys.getsizeof(text)
        + (sys.getsizeof(title) if title is not None else 0)
        + sys.getsizeof(found)
        + sys.getsizeof(numbers)  # its strings are those of `found`
        + strings
    )
    return Words(found, numbers, nbytes, signature(found))


def _entry_bytes(entry: Words | Sketch) -> int:
    return entry.nbytes


CACHE: Final[SizedCache[tuple[str, LeftOut], Words]] = caches.sized_cache("words", _entry_bytes)


def is_cached(text: str, title: LeftOut) -> bool:
    """Whether what is learnt of `text`'s words under `title` is cached: longer texts are
    rare, costly to hold and cheap to split again."""
    return len(text) + (len(title) if isinstance(title, str) else 0) <= WORD_CACHE_MAX_CHARS


def _sketch_of(found: Words, title: LeftOut) -> Sketch:
    strings = sum(map(sys.getsizeof, found.numbers))
    nbytes = (
        _SKETCH_ENTRY_BYTES + (sys.getsizeof(title) if title is not None else 0)
        + sys.getsizeof(found.numbers) + strings
    )
    return Sketch(len(found.all), found.numbers, found.signature, nbytes, title)


def chunk_sketch(chunk: Chunk, *, drop_title_line: TitleLineRule) -> Sketch:
    """The sketch of `chunk_words` (`Candidate.sketch` keeps it with the text's other facts)."""
    return _sketch_of(
        chunk_words(chunk, drop_title_line=drop_title_line),
        left_out(chunk.title, drop_title_line),
    )


def chunk_words(chunk: Chunk, *, drop_title_line: TitleLineRule) -> Words:
    """The words of a chunk, without the first line the policy leaves out."""
    text = chunk.text
    title = left_out(chunk.title, drop_title_line)
    if not is_cached(text, title):
        return _words_of(text, title)
    key = (text, title)
    found = CACHE.get(key)
    if found is None:
        found = _words_of(text, title)
        CACHE.put(key, found)
    return found


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Shared words over all distinct words; an empty set is similar to nothing."""
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def jaccard_at_least(a: frozenset[str], b: frozenset[str], least: float) -> float | None:
    """`jaccard(a, b)` if it is at least `least`, else None.

    Most pairs are far apart: the count stops once the words the smaller set misses in the
    other rule `least` out, after a few look-ups instead of one per word.
    """
    if not a or not b:
        return 0.0 if least <= 0 else None
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    both = len(a) + len(b)
    shared = len(small)
    for word in small:
        if word not in large:
            shared -= 1
            if shared / (both - shared) < least:
                return None
    similarity = shared / (both - shared)
    return similarity if similarity >= least else None


def has_words(text: str) -> bool:
    """Whether `text` holds a word. Text with none (a hostile run of punctuation or blanks)
    is ruled out at C speed in ASCII, instead of by a regex trying every position."""
    if WORD.search(text, 0, 64):  # almost every real text: a word at the start
        return True
    if text.isascii():
        return not text.translate(_BLANK_NON_WORD).isspace() and bool(text)
    return WORD.search(text) is not None
