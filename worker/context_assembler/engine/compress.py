"""Extractive compression: keep the sentences that share the most words with the question.

Sentences are kept verbatim and in their original order, so a citation still quotes real
text; "…" marks where text was left out. Never abstractive: a summary can change the one
number that is the answer.
"""

from __future__ import annotations

import functools
import re

from context_assembler.engine import caches
from context_assembler.engine.words import words

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
ELISION = "…"
# Words too common to say a sentence is about the question.
_STOPWORDS = frozenset(
    "a an and are as at be by can do does for from how i in is it its of on or that the "
    "this to was what when where which who why will with you your".split()
)


def content_words(text: str) -> frozenset[str]:
    return frozenset(words(text)) - _STOPWORDS


# Every passage of an event may be compressed against the same question: split it once per
# event, not once per passage (a 20,000-character question times 2,000 chunks). One entry:
# the memory of one question, which the codec's limits bound.
_question_words = functools.lru_cache(caches.max_entries("question_words"))(content_words)
caches.register_function_cache("question_words", _question_words)


def sentences(text: str) -> list[str]:
    pieces: list[str] = []
    for line in text.splitlines():
        pieces.extend(part.strip() for part in _SENTENCE_END.split(line) if part.strip())
    return pieces


def extract_relevant(text: str, question: str, max_sentences: int) -> str | None:
    """The `max_sentences` most question-like sentences, or None when that saves nothing."""
    question_words = _question_words(question)
    parts = sentences(text)
    scored = [
        (len(question_words & content_words(sentence)), index)
        for index, sentence in enumerate(parts)
    ]
    best = sorted((item for item in scored if item[0] > 0), key=lambda item: (-item[0], item[1]))
    chosen = sorted(index for _, index in best[:max_sentences])
    if not chosen or len(chosen) == len(parts):
        return None
    pieces: list[str] = []
    for position, index in enumerate(chosen):
        if position and index != chosen[position - 1] + 1:
            pieces.append(ELISION)
        pieces.append(parts[index])
    if chosen[0] != 0:
        pieces.insert(0, ELISION)
    if chosen[-1] != len(parts) - 1:
        pieces.append(ELISION)
    return " ".join(pieces)
