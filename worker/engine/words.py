"""Word sets for near-duplicate detection (seed 000: lower-cased \\w+ words).

The first line of a passage is usually its document title ("PW-2400 guide"); leaving it out
keeps two equal paragraphs of two guides equal. Word sets are cached per text; the cache
keys on the text itself, whose hash Python keeps with the string (a set outweighs its text).
"""

from __future__ import annotations

import functools
import re
from typing import Final

WORD = re.compile(r"\w+")
WORD_CACHE_ENTRIES: Final = 10_000  # a set of ~300 words: ~20 KB each at most
# In ASCII text \w is [A-Za-z0-9_]: blanking every other character and splitting on spaces
# finds the same words as WORD, about three times faster.
_BLANK_NON_WORD = str.maketrans(
    dict.fromkeys((c for c in map(chr, range(128)) if not (c.isalnum() or c == "_")), " ")
)


def words(text: str) -> list[str]:
    """The lower-cased \\w+ words of `text`, in order."""
    lowered = text.lower()
    if lowered.isascii():
        return lowered.translate(_BLANK_NON_WORD).split()
    return WORD.findall(lowered)


@functools.lru_cache(maxsize=WORD_CACHE_ENTRIES)
def _word_set(text: str) -> frozenset[str]:
    return frozenset(words(text))


@functools.lru_cache(maxsize=WORD_CACHE_ENTRIES)
def _body_word_set(text: str) -> frozenset[str]:
    return frozenset(words(text.split("\n", 1)[1] if "\n" in text else text))


def word_set(text: str, *, drop_title_line: bool = True) -> frozenset[str]:
    return _body_word_set(text) if drop_title_line else _word_set(text)


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
    return WORD.search(text) is not None
