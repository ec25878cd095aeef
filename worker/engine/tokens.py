"""Token counting: real tokenizers (tiktoken) and the two estimators the seeds use.

A passage's cost is the token count of its rendered form. Counts of real tokenizers are
cached per text, so a popular chunk is tokenised once per process.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Final, Literal, Protocol

from worker.engine.cache import BoundedCache

TokenizerName = Literal["cl100k_base", "o200k_base", "chars/4", "words*1.3"]
TOKENIZERS: Final[tuple[TokenizerName, ...]] = ("cl100k_base", "o200k_base", "chars/4", "words*1.3")
TOKEN_CACHE_ENTRIES: Final = 200_000  # ~120 bytes each: about 25 MB at most


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


class CharsPerFour:
    """Seed 000's estimate: ceil(characters / 4)."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / 4)


class WordsTimesOnePointThree:
    """Seed 003's estimate: whitespace words x 1.3, rounded up (integer arithmetic)."""

    name = "words*1.3"

    def count(self, text: str) -> int:
        return (len(text.split()) * 13 + 9) // 10


class TiktokenCounter:
    """Exact counts for OpenAI encodings, cached per text.

    `encode_ordinary` treats special-token text such as "<|endoftext|>" inside a chunk as
    plain text instead of raising, and is slightly faster than `encode`.
    """

    def __init__(self, encoding_name: str, cache_entries: int = TOKEN_CACHE_ENTRIES) -> None:
        import tiktoken

        from worker.vocabulary import ensure_vocabulary

        ensure_vocabulary(encoding_name)
        self.name = encoding_name
        self._encoding = tiktoken.get_encoding(encoding_name)
        self.cache: BoundedCache[int] = BoundedCache(cache_entries)

    def _count_uncached(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def count(self, text: str) -> int:
        return self.cache.get_or_compute(text, self._count_uncached)


_lock = threading.Lock()


@functools.cache
def _tiktoken_counter(name: str) -> TiktokenCounter:
    return TiktokenCounter(name)


def get_counter(name: TokenizerName) -> TokenCounter:
    """One shared counter per tokenizer name (tiktoken encodings are costly to build)."""
    if name == "chars/4":
        return CharsPerFour()
    if name == "words*1.3":
        return WordsTimesOnePointThree()
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")
    with _lock:  # functools.cache alone may build the same encoding twice under threads
        return _tiktoken_counter(name)
