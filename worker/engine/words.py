"""Word sets for near-duplicate detection (seed 000: lower-cased \\w+ words).

The first line of a passage is usually its document title ("PW-2400 guide"); leaving it out
keeps two equal paragraphs of two guides equal. Profiles are cached per text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from worker.engine.cache import BoundedCache

WORD = re.compile(r"\w+")
WORD_CACHE_ENTRIES: Final = 50_000


@dataclass(frozen=True, slots=True)
class WordProfile:
    """A text's word set, plus the words in one fixed order for prefix filtering.

    Any fixed total order makes the prefix filter exact; `hash` is the cheapest. It varies
    between processes, which changes only which pairs get verified, never the result.
    """

    words: frozenset[str]
    ordered: tuple[str, ...]


def _profile(text: str) -> WordProfile:
    words = frozenset(WORD.findall(text.lower()))
    return WordProfile(words, tuple(sorted(words, key=hash)))


def _body_profile(text: str) -> WordProfile:
    return _profile(text.split("\n", 1)[1] if "\n" in text else text)


_profiles: BoundedCache[WordProfile] = BoundedCache(WORD_CACHE_ENTRIES)
_body_profiles: BoundedCache[WordProfile] = BoundedCache(WORD_CACHE_ENTRIES)


def word_profile(text: str, *, drop_title_line: bool = True) -> WordProfile:
    if drop_title_line:
        return _body_profiles.get_or_compute(text, _body_profile)
    return _profiles.get_or_compute(text, _profile)


def word_set(text: str, *, drop_title_line: bool = True) -> frozenset[str]:
    return word_profile(text, drop_title_line=drop_title_line).words


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Shared words over all distinct words; an empty set is similar to nothing."""
    if not a or not b:
        return 0.0
    shared = len(a & b)
    return shared / (len(a) + len(b) - shared)


def has_words(text: str) -> bool:
    return WORD.search(text) is not None
