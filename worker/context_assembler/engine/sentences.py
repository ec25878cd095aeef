"""Passages cut into sentences for focused compression (`focus`): what focusing reads of a
passage's text whatever the question, made once per text and tokenizer and cached.

A passage is cut into sentences, and a sentence longer than `MAX_SEGMENT_TOKENS` into
pieces at spaces, each verbatim (`segments`). Of each segment the analysis keeps what
scoring asks of it: its light word forms ("released" and "release" meet: `stem`, `terms`),
the words that may be an answer and their kinds (a date, a number, a name: `marks_of`),
whether it leans on the one before ("It", "However"), and, once focusing first weighs
taking one of the passage's segments, their token counts (`Analysis.count_segments`).
Linear in the text: one pass of the sentence regex, words split at C speed.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from typing import Final, NamedTuple

from context_assembler.engine import caches
from context_assembler.engine.candidate import Candidate
from context_assembler.engine.lru import SizedCache
from context_assembler.engine.words import words

# A sentence ends at ".", "!" or "?" (a closing quote or bracket may follow) before blanks,
# unless the stop ends an initial ("J. Smith", "U.S."): a single letter after a blank or
# another stop. One pass, no backtracking: the lookbehinds are fixed width. The pattern
# opens with the blank (the lookbehinds reach back over it) so that the regex engine
# skips to each blank at C speed instead of trying the lookbehinds at every character.
_SENTENCE_END: Final = re.compile(
    r"\s(?<![\s.][A-Za-z][.]\s)(?:(?<=[.!?]\s)|(?<=[.!?][\"')\]]\s))\s*"
)
MAX_SEGMENT_TOKENS: Final = 64  # a longer sentence is taken in pieces of about this many
_CHARS_PER_TOKEN_LEAST: Final = 2  # a piece holds at least this many characters a token

# Words that say nothing of what a sentence is about.
STOPWORDS: Final = frozenset(
    "a about after also am an and any are as at be been before being between both but by "
    "can could did do does doing during each for from had has have having he her hers him "
    "his how i if in into is it its just me more most my no nor not now of off on once only "
    "or other our out over own s same she should so some such t than that the their them "
    "then there these they this those through to too under until up very was we were what "
    "when where which while who whom whose why will with would you your".split()
)
# A sentence that starts with one of these leans on the one before it for its subject.
LEANING: Final = frozenset(
    "it its he his she her they their them this these that those such there however but "
    "also then thus therefore both each another later afterwards instead yet".split()
)
_NUMBER_WORDS: Final = frozenset(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy "
    "eighty ninety hundred thousand million billion trillion dozen first second third "
    "fourth fifth sixth seventh eighth ninth tenth half".split()
)
_MONTHS: Final = frozenset(
    "january february march april may june july august september october november "
    "december century decade".split()
)
_COUNTED: Final = _MONTHS | _NUMBER_WORDS
_MARK_PUNCTUATION: Final = ".,;:!?\"'()[]"  # stripped off a word before it is marked
_YEAR: Final = re.compile(r"\d{3,4}s?|\d{1,2}(?:st|nd|rd|th)")

# The kinds of answer a word may be, and a question may ask for.
DATE, NUMBER, NAME = 1, 2, 4


def _stem(word: str) -> str:
    """A light word form: plural, past and -ing endings and a final e or y off, so that
    "released", "releases" and "release" meet, and "movies" and "movie". An ending goes
    only where at least three letters stay: "-ies" becomes "i", "-sses" "ss", "-es" "e";
    a final "s" stays after "s", "u" or "i" ("glass", "bus")."""
    size = len(word)
    if size <= 3 or not word.isalpha():
        return word
    last = word[-1]
    if last == "s":
        if (word.endswith("ies") and size >= 6) or (word.endswith("sses") and size >= 7):
            word = word[:-2]  # "-ies" to "i", "-sses" to "ss"
        elif (word.endswith("es") and size >= 5) or word[-2] not in "sui":
            word = word[:-1]  # "-es" to "e", or the "s" off
    elif last == "d" and word[-2] == "e" and size >= 5:
        word = word[:-2]
    elif last == "g" and word.endswith("ing") and size >= 6:
        word = word[:-3]
    elif last not in "ey":  # most words: nothing to take off
        return word
    if len(word) > 3 and word[-1] in "ey":
        return word[:-1] + "i" if word[-1] == "y" else word[:-1]
    return word


_stem_short = functools.lru_cache(caches.max_entries("word_forms"))(_stem)
caches.register_function_cache("word_forms", _stem_short)
_CACHED_WORD_CHARS: Final = 32  # longer words are rare: not worth their memory


def stem(word: str) -> str:
    """`_stem`, remembered for the words of usual length."""
    return _stem_short(word) if len(word) <= _CACHED_WORD_CHARS else _stem(word)


def terms(text: str) -> frozenset[str]:
    """The word forms of `text` that can say what it is about."""
    return frozenset(  # `stem` inlined: a call less a word
        _stem_short(word) if len(word) <= _CACHED_WORD_CHARS else _stem(word)
        for word in words(text) if word not in STOPWORDS)


_title_terms_short = functools.lru_cache(caches.max_entries("title_forms"))(terms)
caches.register_function_cache("title_forms", _title_terms_short)
_CACHED_TITLE_CHARS: Final = 200


def title_terms(title: str | None) -> frozenset[str]:
    """`terms` of a chunk's title, remembered for titles of usual length (a popular
    document's chunks share one)."""
    if not title:
        return frozenset()
    return _title_terms_short(title) if len(title) <= _CACHED_TITLE_CHARS else terms(title)


Marks = tuple[tuple[str, int], ...]


def marks_of(sentence: str) -> Marks:
    """The words of `sentence` that may be an answer, each with its kinds (DATE, NUMBER,
    NAME): digits, months, number words, capitalised words after the first."""
    found: list[tuple[str, int]] = []
    for index, token in enumerate(sentence.split()):
        if token[0].islower():  # most words: no name, no digit, so a month or number or none
            word = token.rstrip(_MARK_PUNCTUATION).lower()
            if word in _COUNTED:
                found.append((word, DATE if word in _MONTHS else NUMBER))
            continue
        word = token.strip(_MARK_PUNCTUATION).lower()
        if not word:
            continue
        kind = 0
        if word[0].isdigit():
            kind = NUMBER | (DATE if _YEAR.fullmatch(word) else 0)
        elif word in _MONTHS:
            kind = DATE
        elif word in _NUMBER_WORDS:
            kind = NUMBER
        if index and token[:1].isupper() and word.isalpha() and word not in STOPWORDS:
            kind |= NAME
        if kind:
            found.append((word, kind))
    return tuple(found)


def held_kinds(marks: Marks, question_words: frozenset[str]) -> int:
    """The kinds of answer a sentence holds that the question does not already say."""
    held = 0
    for word, kind in marks:
        if word not in question_words:
            held |= kind
    return held


@dataclass(frozen=True, slots=True)
class Segment:
    """A sentence, or a piece of a long one, as it stands in its passage."""

    text: str
    joined: str  # what joins it to the segment before it: "\n" (it opens a line), " " or ""
    leans: bool  # starts with a word that needs the segment before it
    marks: Marks  # its words that may be an answer (`marks_of`)


# The count of a sentence alone, told whether it will be counted after a blank too.
SentenceCount = Callable[[str, bool], int]


def segments(text: str, count: Callable[[str], int],
             count_sentence: SentenceCount | None = None) -> list[Segment]:
    """`text` cut into sentences, and a sentence that counts more than MAX_SEGMENT_TOKENS
    into pieces at spaces (at a character if it has none): every piece verbatim. A segment
    that starts a line is joined to the one before by a line break, so that the rows of a
    table or a list stay rows."""
    return _segmented(text, count, count_sentence).segments


class _Segmented(NamedTuple):
    """A passage's segments, and the words of each (`words`), which its analysis reads."""

    segments: list[Segment]
    words: list[list[str]]
    ascii: bool  # whether the passage is ASCII, and so every word


def _segmented(text: str, count: Callable[[str], int],
               count_sentence: SentenceCount | None) -> _Segmented:
    """`segments` made a passage at a time rather than a sentence at a time: the sentences
    of every line, the pieces of the long ones alone, then the words of them all at once
    (`_words_each`)."""
    sentences: list[str] = []
    opening: list[int] = []  # the sentences that open a line
    for line in text.splitlines():
        found = list(filter(None, map(str.strip, _SENTENCE_END.split(line))))
        if found:
            opening.append(len(sentences))
            sentences += found
    joins = [" "] * len(sentences)
    for index in opening:
        joins[index] = "\n"
    texts = sentences
    leaning: dict[int, bool] = {}  # what the pieces of a cut sentence lean on, by place
    long = list(compress(range(len(sentences)), map(LONGEST_CHARS.__lt__, map(len, sentences))))
    if long:
        texts, joins, leaning = _cut_long(sentences, joins, long, count, count_sentence)
    ascii = text.isascii()
    words_of, leans = _words_each(texts, ascii)
    for index, lean in leaning.items():
        leans[index] = lean
    marks = _marks_each(texts, words_of, ascii, _ASCII_DIGIT.search(text) is not None)
    return _Segmented(list(map(Segment, texts, joins, leans, marks)), words_of, ascii)


_ASCII_DIGIT: Final = re.compile("[0-9]")


def _marks_each(texts: list[str], words_of: list[list[str]], ascii: bool, digits: bool
                ) -> list[Marks]:
    """`marks_of` each text (`words_of`: its words; `ascii`: whether all are ASCII;
    `digits`: whether any holds an ASCII digit), with no token looked at in an ASCII text
    that can hold no mark: one with no month or number word among its words, no digit,
    and no capital after its first character (most sentences). A token's word, stripped
    of the punctuation around it, is one of its text's words, so a month or a number word
    shows among them."""
    marks: list[Marks] = []
    for text, found in zip(texts, words_of, strict=True):
        if ((ascii or text.isascii()) and text[1:].islower() and _COUNTED.isdisjoint(found)
                and not (digits and _ASCII_DIGIT.search(text))):
            marks.append(())
        else:
            marks.append(marks_of(text))
    return marks


def _cut_long(sentences: list[str], joins: list[str], long: list[int],
              count: Callable[[str], int], count_sentence: SentenceCount | None
              ) -> tuple[list[str], list[str], dict[int, bool]]:
    """The sentences with each long one (`long`: their places) that counts more than
    MAX_SEGMENT_TOKENS cut into pieces (`_pieces`); the joins of them all; whether each
    piece of a cut sentence leans (the first as its sentence does, the others always)."""
    texts: list[str] = []
    joined: list[str] = []
    leaning: dict[int, bool] = {}
    done = 0  # the sentences before this one are in `texts`
    for index in long:
        sentence, join = sentences[index], joins[index]
        pieces = _pieces(sentence, count_sentence(sentence, join != "\n") if count_sentence
                         else count(sentence))
        if len(pieces) == 1:
            continue
        texts += sentences[done:index]
        joined += joins[done:index]
        done = index + 1
        leaning[len(texts)] = _leans(words(sentence[:40]))
        for number, (piece, spaced) in enumerate(pieces):
            if number:
                leaning[len(texts)] = True
            texts.append(piece)
            joined.append(join if number == 0 else " " if spaced else "")
    if not done:
        return sentences, joins, leaning
    return texts + sentences[done:], joined + joins[done:], leaning


# What `words` does to an ASCII text, in one table, but that a line break stays: the words
# of many texts, none of which holds one, are found in one pass and told apart.
_LOWER_WORDS_BUT_LINES: Final = bytes(
    code if chr(code) == "\n" else ord(chr(code).lower())
    if chr(code).isalnum() or chr(code) == "_" else ord(" ")
    for code in range(128)) + bytes(range(128, 256))


def _leans(opening: list[str]) -> bool:
    """Whether a sentence whose first 40 characters hold the words `opening` leans on the
    sentence before it."""
    return bool(opening) and opening[0] in LEANING


def _words_each(texts: list[str], ascii: bool) -> tuple[list[list[str]], list[bool]]:
    """`words` of each text (none holds a line break), and whether each leans (`_leans`):
    the ASCII texts all at once (`ascii`: all are), since `words` costs more a call than
    a word."""
    if ascii:
        return _ascii_words_each(texts)
    plain = list(map(str.isascii, texts))
    found, leaning = _ascii_words_each(list(compress(texts, plain)))
    words_of: list[list[str]] = []
    leans: list[bool] = []
    at = 0  # the next of the ASCII texts' words
    for text, is_plain in zip(texts, plain, strict=True):
        if is_plain:
            words_of.append(found[at])
            leans.append(leaning[at])
            at += 1
        else:
            words_of.append(words(text))
            leans.append(_leans(words(text[:40])))
    return words_of, leans


def _ascii_words_each(texts: list[str]) -> tuple[list[list[str]], list[bool]]:
    """`_words_each` of ASCII texts: blanked and lower-cased in one pass, then split. A
    text that opens with a word opens its first 40 characters with the same word, or with
    the first 40 characters of it, which are no leaning word either."""
    if not texts:
        return [], []
    blanked = ("\n".join(texts).encode("ascii").translate(_LOWER_WORDS_BUT_LINES)
               .decode("ascii").split("\n"))
    words_of = list(map(str.split, blanked))
    return words_of, [
        found[0] in LEANING if blank[0] != " " else _leans(blank[:40].split(None, 1))
        for blank, found in zip(blanked, words_of, strict=True)]


LONGEST_CHARS: Final = MAX_SEGMENT_TOKENS * _CHARS_PER_TOKEN_LEAST  # a piece's at most


def _pieces(sentence: str, tokens: int) -> list[tuple[str, bool]]:
    """(piece, whether a space came before it) for a sentence of `tokens` cut to about
    MAX_SEGMENT_TOKENS each; one that counts no more is one piece (`_cut_long` asks only of
    the sentences over LONGEST_CHARS)."""
    longest = LONGEST_CHARS
    if tokens <= MAX_SEGMENT_TOKENS:
        return [(sentence, True)]
    pieces: list[tuple[str, bool]] = []
    start, spaced = 0, True
    while start < len(sentence):
        end = min(len(sentence), start + longest)
        if end < len(sentence):
            cut = sentence.rfind(" ", start + 1, end + 1)
            end = cut if cut > start else end
        piece = sentence[start:end]
        pieces.append((piece, spaced))
        rest = sentence[end:]
        spaced = rest[:1] == " "
        start = end + (1 if spaced else 0)
    return pieces


NOT_COUNTED: Final = -1  # a segment's count before its passage is first weighed


@dataclass(frozen=True, slots=True)
class Analysis:
    """What focusing reads of a passage's text whatever the question and the title: its
    segments, their counts (each after its joiner; the first at a line start), and where
    each word form is."""

    segments: tuple[Segment, ...]
    # each segment's count, all NOT_COUNTED until focusing first weighs taking one of them
    # (`count_segments`): most passages of a long event never come that far, and counting
    # is most of an analysis (not 0: a tokenizer.json may count a text 0)
    tokens: list[int]
    # word form -> the segments holding it, in order (bytes where every index fits one)
    postings: dict[str, bytes | tuple[int, ...]]
    kinds: tuple[int, ...]  # per segment, the kinds of answer it holds (`marks_of`)
    marked: dict[str, tuple[int, ...]]  # a word `marks_of` marks -> the segments it marks
    nbytes: int  # what holding it in the cache costs, approximately
    # the spaces before each segment (the first: 0) where the text is its segments joined by
    # runs of spaces, else None: the text's count after a blank is then known from theirs
    gaps: tuple[int, ...] | None
    _split: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    # what the render asks of the text after a blank, once worked out (it depends on the
    # text and the tokenizer alone, as the analysis does): _FIRST, _WHOLE -> count
    spaced: dict[int, int] = field(default_factory=dict)

    def split(self, asked: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The segments that hold a kind of answer `asked` names, and the others (made
        once per kind of question: there are a handful)."""
        found = self._split.get(asked)
        if found is None:
            found = self._split[asked] = (
                tuple(i for i, kind in enumerate(self.kinds) if kind & asked),
                tuple(i for i, kind in enumerate(self.kinds) if not kind & asked),
            )
        return found

    def count_segments(self, count: Callable[[str], int]) -> None:
        """Count every segment (the first at a line start, any other after its joiner),
        once per analysis: the counts depend on the text and the tokenizer alone. All at
        once, so that a thread sees either every count or none."""
        if self.tokens[0] == NOT_COUNTED:
            self.tokens[:] = [count(part.text) if index == 0 else count(part.joined + part.text)
                              for index, part in enumerate(self.segments)]


def _analysis_bytes(analysis: Analysis) -> int:
    return analysis.nbytes


# By (text key, tokenizer): a popular passage is split, stemmed and counted once, whatever
# title it comes under (a copy of a passage under another document's title shares it).
ANALYSES: Final[SizedCache[tuple[int, str], Analysis]] = caches.sized_cache(
    "sentences", _analysis_bytes)
_ENTRY_BYTES: Final = 400  # the entry, its key and tuples, besides what is counted below
_SEGMENT_BYTES: Final = 200  # a Segment and its tuple of marks
_WORD_BYTES: Final = 64  # a marked word, and its tuple slot
_POSTING_BYTES: Final = 64  # a word form's entry in `postings`: its slot and its bytes or tuple
_INDEX_BYTES: Final = 8  # a segment's index in a marked word's tuple (small ints are shared)
_SPLITS_BYTES: Final = 64  # a segment's place in the `split` of every kind of question
_SPACED_BYTES: Final = 240  # `spaced`, once filled: a small dict of two counts
# `sys.getsizeof` of an ASCII str is this and its length (CPython's compact strings)
_ASCII_STR_BYTES: Final = sys.getsizeof("")


def analyse(candidate: Candidate, count: Callable[[str], int], tokenizer: str,
            count_sentence: SentenceCount | None = None) -> Analysis:
    """The passage's `Analysis`, from the cache when a request has made it before."""
    key = (candidate.text_key, tokenizer)
    found = ANALYSES.get(key)
    if found is not None:
        return found
    cut = _segmented(candidate.text, count, count_sentence)
    parts = tuple(cut.segments)
    # The segments' word forms (`terms`) are kept only here: each segment's index once in
    # the list of each form it holds, as its words come (no set made per segment).
    postings: dict[str, list[int]] = {}
    holding_of = postings.get
    for index, found_words in enumerate(cut.words):
        for word in found_words:
            if word in STOPWORDS:
                continue
            term = _stem_short(word) if len(word) <= _CACHED_WORD_CHARS else _stem(word)
            holding = holding_of(term)  # no list made and thrown away per word
            if holding is None:
                postings[term] = [index]
            elif holding[-1] != index:
                holding.append(index)
    marked: dict[str, list[int]] = {}
    kinds_of: list[int] = []
    for index, part in enumerate(parts):
        kinds_here = 0
        for word, kind in part.marks:
            kinds_here |= kind
            found_in = marked.setdefault(word, [])
            if not found_in or found_in[-1] != index:
                found_in.append(index)
        kinds_of.append(kinds_here)
    kinds = tuple(kinds_of)
    nbytes = (
        _ENTRY_BYTES + 2 * len(candidate.text)
        + _SEGMENT_BYTES * len(parts) + _WORD_BYTES * sum(len(part.marks) for part in parts)
        # word forms counted as if no other passage held them (they are often shared)
        + (_ASCII_STR_BYTES * len(postings) + sum(map(len, postings)) if cut.ascii
           else sum(map(sys.getsizeof, postings)))
        + _POSTING_BYTES * len(postings)
        + (1 if len(parts) <= 256 else _INDEX_BYTES) * sum(map(len, postings.values()))
        + _POSTING_BYTES * len(marked) + _INDEX_BYTES * sum(map(len, marked.values()))
        + _SPLITS_BYTES * len(parts)
        + _SPACED_BYTES + _INDEX_BYTES * len(parts)  # `spaced` and `gaps`
    )
    compact: Callable[[list[int]], bytes | tuple[int, ...]] = (
        bytes if len(parts) <= 256 else tuple)
    found = Analysis(parts, [NOT_COUNTED] * len(parts),
                     dict(zip(postings, map(compact, postings.values()), strict=True)), kinds,
                     {w: tuple(i) for w, i in marked.items()}, nbytes,
                     _gaps(candidate.text, parts))
    ANALYSES.put(key, found)
    return found


def _gaps(text: str, parts: tuple[Segment, ...]) -> tuple[int, ...] | None:
    """The spaces before each segment where `text` is its segments joined by runs of
    spaces, each segment ending in a non-blank (so that every seam is a cut); else None."""
    if not parts or not text.startswith(parts[0].text):
        return None
    gaps, at = [0], len(parts[0].text)
    for part in parts[1:]:
        start = at
        while text.startswith(" ", at):
            at += 1
        if at == start or part.joined != " " or not text.startswith(part.text, at):
            return None
        gaps.append(at - start)
        at += len(part.text)
    if at != len(text) or any(part.text[-1].isspace() for part in parts):
        return None
    return tuple(gaps)
