"""Query-focused packing (`[compress] mode = "focused"`): the budget goes to the sentences
most likely to hold the answer, wherever they are, instead of to whole passages.

Every passage is cut into sentences (a sentence longer than `MAX_SEGMENT_TOKENS` into
pieces at spaces). Each sentence is scored against the question with lexical evidence:
- the question's words it holds, each weighted by how rare it is among this event's own
  passages (IDF: a word every passage holds says little), compared in light word forms
  ("released" and "release" match);
- the question's words its passage (title included) holds: a sentence of a passage about
  the question's subject often answers without naming it again;
- what the question asks for: a year or date for "when" and "what year", a number for
  "how many" or "how much", a name (a capitalised word the question lacks) for "who" and
  "where";
- a strong neighbour: the sentence after or before one that matches the question;
- the reranker's verdict (the chunk's score, or its rank) as a small prior.
Sentences are then taken best first, each with what it leans on: a sentence that starts
with a pronoun or a connective ("It", "He", "This", "However") brings the sentence before
it, which names its subject. Taking stops at the first sentence that does not fit, so the
sentences kept at a budget are a prefix of one order that does not depend on the budget:
a larger budget keeps everything a smaller one kept, and more (a passage walk that skips
what does not fit and tries the next can keep less at a larger budget).

Extractive: each kept sentence is verbatim, in its passage's order, "…" where text was
left out; a passage with every sentence kept is its whole text. Linear in the input: each
passage is split and scored once, each sentence taken once, one sort.
"""

from __future__ import annotations

import functools
import heapq
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import compress
from typing import Final, NamedTuple

from context_assembler.contract.models import DropReason
from context_assembler.engine import caches
from context_assembler.engine.candidate import Candidate, Drop
from context_assembler.engine.compress import ELISION
from context_assembler.engine.dedup import CopyDetector
from context_assembler.engine.facts import remember_terms
from context_assembler.engine.lru import SizedCache
from context_assembler.engine.render import neutralise
from context_assembler.engine.words import is_cached, words

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

# What a question asks for, by its opening words.
DATE, NUMBER, NAME = 1, 2, 4
_ASKS: Final = (
    (("when",), DATE),
    (("what", "year"), DATE), (("which", "year"), DATE), (("what", "date"), DATE),
    (("what", "century"), DATE), (("how", "old"), NUMBER | DATE),
    (("how", "many"), NUMBER), (("how", "much"), NUMBER), (("how", "long"), NUMBER | DATE),
    (("how", "far"), NUMBER), (("how", "tall"), NUMBER), (("how", "big"), NUMBER),
    (("what", "percentage"), NUMBER), (("what", "number"), NUMBER),
    (("who",), NAME), (("whom",), NAME), (("whose",), NAME), (("where",), NAME),
)


@dataclass(frozen=True, slots=True)
class Weights:
    """How much each kind of evidence counts (the words the sentence shares count 1)."""

    passage: float = 0.8
    asked: float = 0.35
    neighbour: float = 0.3
    prior: float = 0.1
    opening: float = 0.05


WEIGHTS: Final = Weights()


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


def asks_for(question: str) -> int:
    """What kind of answer `question` asks for (DATE, NUMBER, NAME bits; 0: no cue)."""
    found = words(question)
    asked = 0
    for start in range(min(len(found), 3)):  # "and when did", "in what year"
        for opening, kind in _ASKS:
            if tuple(found[start:start + len(opening)]) == opening:
                asked |= kind
        if asked:
            return asked
    return asked


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
    long = list(compress(range(len(sentences)), map(_LONGEST_CHARS.__lt__, map(len, sentences))))
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


_LONGEST_CHARS: Final = MAX_SEGMENT_TOKENS * _CHARS_PER_TOKEN_LEAST  # a piece's at most


def _pieces(sentence: str, tokens: int) -> list[tuple[str, bool]]:
    """(piece, whether a space came before it) for a sentence cut to about
    MAX_SEGMENT_TOKENS each; a short sentence (`tokens`: its count, or 0 where it is too
    short in characters to be long) is one piece."""
    longest = _LONGEST_CHARS
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


@dataclass(slots=True)
class _Passage:
    """A candidate as focusing weighs it: by the word forms its text holds (`passage_terms`)
    until its sentences may rank among the best, then by its analysis (`open`)."""

    candidate: Candidate
    terms: AbstractSet[str] | _Joined  # the word forms its text holds
    titled: frozenset[str]  # the word forms of its title
    analysis: Analysis | None = None  # once analysed (`opened` reads it)
    segments: tuple[Segment, ...] = ()  # these three once opened
    tokens: list[int] = field(default_factory=list)  # the analysis's counts, or NOT_COUNTED
    chosen: list[bool] = field(default_factory=list)
    header: int = -1  # its cost without text, paid with its first segment (-1: not counted)
    header_text: str = ""  # the passage as rendered before its text, once counted
    taken: int = 0  # segments chosen
    admitted: bool = False

    def open(self, analysis: Analysis) -> None:
        self.analysis, self.segments, self.tokens = analysis, analysis.segments, analysis.tokens
        self.chosen = [False] * len(analysis.segments)

    @property
    def opened(self) -> Analysis:
        """Its analysis: only an opened passage has a segment taken or weighed."""
        assert self.analysis is not None
        return self.analysis


class _Joined:
    """Word forms each between line breaks, as the text's facts keep them: a string costs a
    tenth of a set of them to hold, and a search in it a microsecond."""

    __slots__ = ("joined",)

    def __init__(self, joined: str) -> None:
        self.joined = joined

    def __contains__(self, term: object) -> bool:
        return f"\n{term}\n" in self.joined

    def forms(self) -> frozenset[str]:
        """The forms as a set: a search reads the whole string, a set looks up one form."""
        return frozenset(self.joined.split("\n")) - {""}


def passage_terms(candidate: Candidate, analysis: Analysis | None,
                  analysed: Callable[[], Analysis]) -> AbstractSet[str] | _Joined:
    """The word forms of the candidate's text: what weighs a passage before it is opened.
    Its analysis's where it is at hand; else as its text's facts remember them; else read
    from the whole text at once (the same forms as its analysis finds in its segments),
    unless a run of the text without a space is long enough that a segment may be cut
    inside a word (`_pieces`): then from its analysis. Remembered with the text's other
    facts where its word set would be."""
    if analysis is not None:
        return analysis.postings.keys()
    if candidate.facts.terms is not None:
        return _Joined(candidate.facts.terms)
    text = candidate.text
    held: AbstractSet[str] = (
        terms(text) if max(map(len, text.split(" "))) < _LONGEST_CHARS
        else analysed().postings.keys())
    if is_cached(text, None):
        candidate.facts = remember_terms(candidate.text_key, "\n" + "\n".join(held) + "\n")
    return held


@dataclass(frozen=True, slots=True)
class Focused:
    """A passage as focusing left it: its text, its cost, whether text was left out, and
    its segments kept, of how many."""

    candidate: Candidate
    text: str
    tokens: int
    compressed: bool
    sentences: tuple[int, int]
    text_tokens: int | None = None  # the count of " " + text, where known: the render's


def extract(passage: _Passage, elision: int) -> tuple[list[str], list[int | None]]:
    """The chosen segments in order, "…" where any were left out, in pieces (joined, the
    extract), each with its count where it is known (None: not); the whole text, one
    piece, if none was left out. Each piece but the first starts with the blank that joins
    it, as its count was cached (`analyse`), so that the pieces' counts add up
    (`count_known`). `elision`: the count of " …"."""
    if passage.taken == len(passage.segments):
        return [passage.candidate.text], [None]
    pieces: list[str] = []
    counts: list[int | None] = []
    previous = -1
    for index, segment in enumerate(passage.segments):
        if not passage.chosen[index]:
            continue
        if index != previous + 1:
            pieces += [f" {ELISION}" if pieces else ELISION, f" {segment.text}"]
            counts += [elision if counts else None,
                       passage.tokens[index] if segment.joined == " " else None]
        else:
            pieces.append(segment.joined + segment.text if pieces else segment.text)
            counts.append(passage.tokens[index])
        previous = index
    if previous != len(passage.segments) - 1:
        pieces.append(f" {ELISION}")
        counts.append(elision)
    return pieces, counts


def weights_of_terms(shared: list[list[str]], question: frozenset[str]) -> dict[str, float]:
    """Each question word's weight: its inverse document frequency among the passages
    (`shared`: the question's words each passage holds)."""
    frequency = dict.fromkeys(question, 0)
    for held in shared:
        for term in held:
            frequency[term] += 1
    total = len(shared)
    return {
        term: math.log(1 + (total - found + 0.5) / (found + 0.5))
        for term, found in sorted(frequency.items())
    }


def priors(candidates: list[Candidate]) -> dict[int, float]:
    """The reranker's verdict in [0, 1]: the chunk's score relative to the best, or, without
    scores on every chunk, 1 / rank."""
    scores = [c.score for c in candidates]
    if not candidates or any(s is None for s in scores):
        return {c.rank: 1.0 / c.rank for c in candidates}
    low, high = min(s or 0.0 for s in scores), max(s or 0.0 for s in scores)
    if high == low:
        return dict.fromkeys((c.rank for c in candidates), 1.0)
    return {c.rank: ((c.score or 0.0) - low) / (high - low) for c in candidates}


Ranked = tuple[float, int, int]  # (minus the score, passage index, segment index)
# In `scored`'s queue: a segment and the rest of its stream, or a passage's bound and None.
Queued = tuple[float, int, int, Iterator[Ranked] | None]
# A passage of at most this many segments has each scored one by one: its segments mostly
# match, neighbour one that does or open it, and sets and groups cost more than they save.
_SCORED_WHOLE: Final = 16
_UNOPENED: Final = -1  # the segment index of a passage's bound in the queue (`scored`)
_SLACK: Final = 1e-9  # above the float rounding of a score's few additions
# Characters of text an event's passages may hold, a token of the budget, for all of them
# to be analysed at once (`focus`): about 3 tokens of text a token of budget.
_ANALYSED_AT_ONCE: Final = 12
# Most question forms a passage's remembered forms are searched for (`_Joined`): each
# search reads them all, so a longer question has them made a set first.
_SEARCHES_A_PASSAGE: Final = 8


@dataclass(frozen=True, slots=True)
class _Question:
    """What scoring a passage's segments needs of the question."""

    words: frozenset[str]
    asked: int  # `asks_for`
    share: dict[str, float]  # what holding each of its word forms adds
    weights: Weights


def scored(passages: list[_Passage], question: str, open_passage: Callable[[_Passage], None],
           weights: Weights = WEIGHTS, at_once: bool = False) -> Iterator[Ranked]:
    """Every segment, best first (ties: the better-ranked passage, then the earlier
    segment). A passage is opened (`open_passage`: cut into sentences, then scored) only
    once its bound, the most any of its segments can score, is reached: until then it
    waits in the queue at its bound, so that no segment of it can come after one it would
    have preceded. A passage whose question words are few or common is never opened when
    the budget is spent before, which keeps a large event's cost near that of the passages
    it takes from. `at_once`: every passage opened and scored first, one merge (where
    nearly every passage gives a sentence, bounds would only add work).

    Within a passage, only the segments a question word, a neighbour of one or its opening
    sets apart are scored one by one; the rest score the same within their two groups
    (holding what the question asks for, or not). A short passage (most of whose segments
    would be set apart anyway) has every segment scored."""
    question_terms = terms(question)
    if len(question_terms) > _SEARCHES_A_PASSAGE:  # searches would cost more than sets
        for passage in passages:
            if isinstance(passage.terms, _Joined):
                passage.terms = passage.terms.forms()
    shared_by = [
        sorted(question_terms & passage.titled | (
            {term for term in question_terms if term in passage.terms}
            if isinstance(passage.terms, _Joined) else question_terms & passage.terms))
        for passage in passages]
    idf = weights_of_terms(shared_by, question_terms)
    mass = sum(idf.values()) or 1.0
    share = {term: weight / mass for term, weight in idf.items()}  # what a match adds
    asked = asks_for(question)
    asking = _Question(frozenset(words(question)), asked, share, weights)
    prior = priors([p.candidate for p in passages])
    added_most = (weights.asked if asked else 0.0) + weights.opening + _SLACK
    explicit: list[Ranked] = []  # of the passages analysed already: scored at once
    streams: list[Iterator[Ranked]] = []
    waiting: list[tuple[float, int, int, None]] = []  # the others, at their bounds
    bases: list[float] = []
    for number, passage in enumerate(passages):
        shared = shared_by[number]
        about = sum(idf[t] for t in shared) / mass
        base = weights.passage * about + weights.prior * prior[passage.candidate.rank]
        bases.append(base)
        if at_once:
            open_passage(passage)
            streams += _segments_ranked(passage, number, base, shared, asking, explicit)
            continue
        matched = sum(share[t] for t in shared if t in passage.terms)
        bound = base + (1 + weights.neighbour) * matched + added_most
        waiting.append((-bound, number, _UNOPENED, None))
    explicit.sort()
    if not waiting:  # every passage scored: one merge
        yield from heapq.merge(explicit, *streams)
        return
    queue: list[Queued] = [*waiting]
    for stream in [iter(explicit), *streams]:
        _enqueue(queue, stream)
    heapq.heapify(queue)
    while queue:
        key, number, index, rest = queue[0]
        if rest is None:  # a passage's bound: open it, queue its segments' streams instead
            heapq.heappop(queue)
            passage = passages[number]
            open_passage(passage)
            scored_now: list[Ranked] = []
            for stream in _segments_ranked(passage, number, bases[number], shared_by[number],
                                           asking, scored_now):
                _enqueue(queue, stream, heapq.heappush)
            scored_now.sort()
            _enqueue(queue, iter(scored_now), heapq.heappush)
            continue
        yield key, number, index
        following = next(rest, None)
        if following is None:
            heapq.heappop(queue)
        else:
            heapq.heapreplace(queue, (*following, rest))



def _enqueue(queue: list[Queued], stream: Iterator[Ranked],
             add: Callable[[list[Queued], Queued], None] = list.append) -> None:
    """Put `stream` in the queue at its first segment, unless it has none."""
    first = next(stream, None)
    if first is not None:
        add(queue, (*first, stream))


def _segments_ranked(passage: _Passage, number: int, base: float, shared: list[str],
                     question: _Question, explicit: list[Ranked]) -> list[Iterator[Ranked]]:
    """An opened passage's segments: those scored one by one added to `explicit`, and its
    two groups of segments that share a score, each a stream in order (`scored`)."""
    analysis, size = passage.opened, len(passage.segments)
    share, asked, question_words = question.share, question.asked, question.words
    neighbour, opening = question.weights.neighbour, question.weights.opening
    asked_weight = question.weights.asked
    postings = analysis.postings
    # A segment marking a word the question names is judged by what else it marks
    # (`held_kinds`); any other holds the kinds its analysis found.
    judged: set[int] = set()
    if asked:
        marked = analysis.marked
        for word in question_words:
            if word in marked:
                judged.update(marked[word])
    matched: dict[int, float] = {}
    for term in shared:
        holding_term = postings.get(term)
        if holding_term:
            added = share[term]
            for index in holding_term:
                matched[index] = matched.get(index, 0.0) + added
    special: set[int] | range = (  # a short passage: every segment, no sets, no groups
        range(size) if size <= _SCORED_WHOLE else _set_apart(matched, judged, size))
    kinds_of, found = analysis.kinds, matched.get
    append = explicit.append
    for index in special:
        score = base + found(index, 0.0) + neighbour * max(found(index - 1, 0.0),
                                                            found(index + 1, 0.0))
        kinds = (held_kinds(passage.segments[index].marks, question_words)
                 if index in judged else kinds_of[index])
        if kinds & asked:
            score += asked_weight
        if index == 0:
            score += opening
        append((-score, number, index))
    if len(special) == size:
        return []
    holding, others = analysis.split(asked)
    return [_group(-(base + asked_weight), number, holding, special),
            _group(-base, number, others, special)]


def _set_apart(matched: dict[int, float], judged: set[int], size: int) -> set[int]:
    """The segments of a long passage scored one by one: the matched ones, their
    neighbours, the opening and the judged ones."""
    special = set(matched)
    special.update([index - 1 for index in matched])
    special.update([index + 1 for index in matched])
    special.discard(-1)
    special.discard(size)
    special.add(0)
    special |= judged
    return special


def _group(key: float, number: int, indices: tuple[int, ...], scored_apart: set[int] | range
           ) -> Iterator[Ranked]:
    """The segments of one passage that share a score, but those scored one by one."""
    return ((key, number, index) for index in indices if index not in scored_apart)


class _Taking:
    """The segments taken so far, and what the context costs as estimated: each passage's
    header and label, its segments' counts, its "…" marks and a separator between
    passages."""

    def __init__(self, budget: int, separator: int, elision: int,
                 count: Callable[[str], int], header: Callable[[Candidate], str]) -> None:
        self.count = count
        self.render_header = header
        self.budget = budget
        self.separator = separator
        self.elision = elision
        self.used = 0
        self.admitted: list[_Passage] = []
        self.steps: list[tuple[_Passage, list[int], bool]] = []  # to undo the last ones

    def closure(self, passage: _Passage, index: int) -> list[int]:
        """`index` and the segments before it that it leans on, not yet chosen."""
        needed = [index]
        segments, chosen = passage.segments, passage.chosen
        while index > 0 and segments[index].leans and not chosen[index - 1]:
            index -= 1
            needed.append(index)
        return needed

    def cost(self, passage: _Passage, needed: list[int]) -> int:
        """What choosing `needed` (a run of unchosen segments, last first) adds to the
        context, by the estimate: its segments, the change in "…" marks (one per run of
        segments left out, once any is chosen) and, for a passage's first, its header and
        separator. Worked out from the run's two neighbours alone."""
        low, high = needed[-1], needed[0]
        chosen, tokens = passage.chosen, passage.tokens
        if tokens[0] == NOT_COUNTED:  # the first time any segment of it is weighed
            passage.opened.count_segments(self.count)
        gap_before = low > 0 and not chosen[low - 1]
        gap_after = high + 1 < len(chosen) and not chosen[high + 1]
        marks = gap_before + gap_after - (1 if passage.taken else 0)
        added = (tokens[high] if low == high else sum(tokens[low:high + 1])) + marks * self.elision
        if passage.admitted:
            return added
        if passage.header < 0:  # counted only for the passages that come this far
            passage.header_text = self.render_header(passage.candidate)
            passage.header = self.count(passage.header_text)
        return added + passage.header + (self.separator if self.admitted else 0)

    def take(self, passage: _Passage, needed: list[int], cost: int) -> None:
        admitted_now = not passage.admitted
        if admitted_now:
            passage.admitted = True
            self.admitted.append(passage)
        for index in needed:
            passage.chosen[index] = True
        passage.taken += len(needed)
        self.used += cost
        self.steps.append((passage, needed, admitted_now))

    def undo(self) -> _Passage | None:
        """Give back the last step; the passage it admitted, if it did."""
        passage, needed, admitted_now = self.steps.pop()
        for index in needed:
            passage.chosen[index] = False
        passage.taken -= len(needed)
        if admitted_now:
            passage.admitted = False
            self.admitted.remove(passage)
            return passage
        return None


@dataclass(frozen=True, slots=True)
class FocusPacking:
    """What focusing needs besides the candidates: the passage budget, the question, how a
    text counts, how a passage costs as rendered, and the separator's count."""

    budget: int
    question: str
    count: Callable[[str], int]
    # the exact count of the parts joined, given the counts of some (None: not known)
    count_known: Callable[[Sequence[str], Sequence[int | None]], int]
    # the count of the right part, given the count of both (`TokenCounter.count_rest`)
    count_rest: Callable[[int, str, str], int | None]
    tokenizer: str  # the name of what `count` counts with: analyses are kept per tokenizer
    header: Callable[[Candidate], str]  # the passage as rendered before its text
    cost: Callable[[Candidate, str], int]
    separator_tokens: int
    max_chunks: int | None
    weights: Weights = WEIGHTS


def focus(
    candidates: list[Candidate], packing: FocusPacking, detector: CopyDetector
) -> tuple[list[Focused], list[Drop]]:
    """The passages the best sentences come from, in the order they were first taken, and
    the candidates none of whose sentences was taken, with why."""
    count, tokenizer = packing.count, packing.tokenizer
    count_sentence = sentence_counter(packing)

    def analysed(candidate: Candidate) -> Analysis:
        return analyse(candidate, count, tokenizer, count_sentence)

    def open_passage(passage: _Passage) -> None:
        passage.open(passage.analysis or analysed(passage.candidate))

    # Where the budget holds a good share of the event's text, nearly every passage gives
    # a sentence: all are analysed at once, as weighing them by word forms first would
    # only add work.
    every = sum(len(c.text) for c in candidates) <= _ANALYSED_AT_ONCE * packing.budget
    passages = []
    for candidate in candidates:
        at_hand = (analysed(candidate) if every
                   else ANALYSES.get((candidate.text_key, tokenizer)))
        held = passage_terms(candidate, at_hand, functools.partial(analysed, candidate))
        passages.append(_Passage(candidate, held, title_terms(candidate.title), at_hand))
    taking = _Taking(packing.budget, packing.separator_tokens, count(f" {ELISION}"), count,
                     packing.header)
    dropped: dict[int, Drop] = {}
    refused: set[int] = set()  # passages left out: copies, or beyond max_chunks
    stopped: tuple[int, str] | None = None
    ranked = scored(passages, packing.question, open_passage, packing.weights, at_once=every)
    for place, (_, number, index) in enumerate(ranked):
        passage = passages[number]
        if number in refused or passage.chosen[index]:
            continue
        if not passage.admitted:
            if packing.max_chunks is not None and len(taking.admitted) >= packing.max_chunks:
                refused.add(number)
                dropped[number] = passage.candidate.drop(
                    DropReason.MAX_CHUNKS,
                    f"context already holds max_chunks={packing.max_chunks}")
                continue
            twin = detector.find_twin(passage.candidate)
            if twin is not None:
                refused.add(number)
                dropped[number] = twin.drop(passage.candidate)
                continue
        needed = taking.closure(passage, index)
        cost = taking.cost(passage, needed)
        if taking.used + cost > packing.budget:
            stopped = (place + 1, f"{cost} tokens")
            break
        if not passage.admitted:
            detector.add_kept(passage.candidate)
        taking.take(passage, needed, cost)
    kept = _exact(taking, packing, dropped)
    for number, passage in enumerate(passages):
        if number in dropped or passage.admitted:
            continue
        detail = ("no sentence of it was among the best that fit the budget"
                  + (f" (the next best, sentence {stopped[0]} of the event's order, needed "
                     f"{stopped[1]}, {max(0, packing.budget - taking.used)} left)"
                     if stopped else ""))
        dropped[number] = passage.candidate.drop(DropReason.OVER_BUDGET, detail)
    return kept, [dropped[n] for n in sorted(dropped)]


def sentence_counter(packing: FocusPacking) -> SentenceCount:
    """How `segments` counts a long sentence alone: where it follows a blank, its count
    after the blank (cached: the analysis counts the segment so, once focusing weighs
    taking it) less its first word's after a blank, plus its first word's alone (words
    often seen, cached), so that the tokenizer reads the sentence once; exact where the
    first word ends at a cut (`count_rest`)."""
    count, count_rest, count_known = packing.count, packing.count_rest, packing.count_known

    def count_sentence(sentence: str, spaced: bool) -> int:
        cut = sentence.find(" ")
        if spaced and cut > 0 and not sentence[cut - 1].isspace():
            word, rest = sentence[:cut], sentence[cut:]
            rest_tokens = count_rest(count(f" {sentence}"), f" {word}", rest)
            if rest_tokens is not None:
                return count_known([word, rest], [None, rest_tokens])
        return count(sentence)

    return count_sentence


def _exact(taking: _Taking, packing: FocusPacking, dropped: dict[int, Drop]) -> list[Focused]:
    """The taken passages as rendered, recounted exactly; while the estimate fell short of
    the exact count, the last steps are given back (the budget is never exceeded)."""
    while True:
        kept = [_rendered(p, packing, taking.elision) for p in taking.admitted]
        total = sum(k.tokens for k in kept) + packing.separator_tokens * max(0, len(kept) - 1)
        if total <= packing.budget or not taking.steps:
            return kept
        gone = taking.undo()
        if gone is not None:  # copies dropped for it now point at nothing shown
            for number, drop in list(dropped.items()):
                if drop.duplicate_of == gone.candidate.chunk_id:
                    del dropped[number]


def _rendered(passage: _Passage, packing: FocusPacking, elision: int) -> Focused:
    """The passage as extracted, with its exact cost: counted from its pieces (whose counts
    are mostly known) where rendering leaves its text as it is, else rendered whole."""
    candidate = passage.candidate
    sentences = (passage.taken, len(passage.segments))
    pieces, counts = extract(passage, elision)
    text = "".join(pieces)
    if text is candidate.text or len(pieces) == 1:
        header = passage.header_text
        spaced = header.endswith(" ") and neutralise(candidate.text) == candidate.text
        if spaced and passage.opened.gaps is not None:
            # the text after its blank counted from its segments' counts, then the passage
            # as its header (less the blank) and that: the tokenizer does not read it again
            known: int | None = _spaced_whole(passage, passage.opened.gaps, packing)
            tokens = packing.count_known([header[:-1], f" {candidate.text}"], [None, known])
            return Focused(candidate, candidate.text, tokens, False, sentences, known)
        tokens = packing.cost(candidate, candidate.text)
        known = None
        if spaced:  # the text after its blank, as the render counts the passage under its
            # final label (header, then this: a cut); where the render defuses the text,
            # what it shows differs
            known = packing.count_rest(tokens, header[:-1], f" {candidate.text}")
        return Focused(candidate, candidate.text, tokens, False, sentences, known)
    if neutralise(text) != text:
        return Focused(candidate, text, packing.cost(candidate, text), True, sentences)
    header = passage.header_text  # rendered when it was admitted (`_Taking.cost`)
    if header.endswith(" "):  # "[S1] (-) " + "It …": counted as "[S1] (-)" + " It …", a cut
        # The extract after its blank, counted once from its pieces: the render counts the
        # passage under its final label from it.
        first = elision if pieces[0] == ELISION else _spaced_first(passage, packing)
        tokens = packing.count_known([f" {pieces[0]}", *pieces[1:]], [first, *counts[1:]])
        return Focused(candidate, text, packing.count_known([header[:-1], f" {text}"],
                                                            [None, tokens]), True, sentences,
                       tokens)
    return Focused(candidate, text, packing.count_known([header, *pieces], [None, *counts]),
                   True, sentences)


_FIRST, _WHOLE = 0, 1  # keys of `Analysis.spaced`


def _spaced_first(passage: _Passage, packing: FocusPacking) -> int:
    """The count of the passage's first segment after a blank, from its count at a line
    start (the analysis's) and its first word's two counts (short, mostly cached) where
    the counter says the rest counts alone, so that the tokenizer does not read the
    sentence again; once per analysis."""
    spaced = passage.opened.spaced
    found = spaced.get(_FIRST)
    if found is not None:
        return found
    first = passage.segments[0].text
    cut = first.find(" ")
    rest_tokens = (packing.count_rest(passage.tokens[0], first[:cut], first[cut:]) if cut > 0
                   else None)
    found = spaced[_FIRST] = (
        packing.count(f" {first}") if rest_tokens is None
        else packing.count_known([f" {first[:cut]}", first[cut:]], [None, rest_tokens]))
    return found


def _spaced_whole(passage: _Passage, gaps: tuple[int, ...], packing: FocusPacking) -> int:
    """The count of the passage's whole text after a blank, from its segments' counts (each
    after one space; a longer run of spaces is its spaces but one, then that); once per
    analysis."""
    spaced = passage.opened.spaced
    found = spaced.get(_WHOLE)
    if found is not None:
        return found
    segments, tokens = passage.segments, passage.tokens
    parts = [f" {segments[0].text}"]
    counts: list[int | None] = [_spaced_first(passage, packing)]
    for index in range(1, len(segments)):
        if gaps[index] > 1:
            parts.append(" " * (gaps[index] - 1))
            counts.append(None)
        parts.append(f" {segments[index].text}")
        counts.append(tokens[index])
    found = spaced[_WHOLE] = packing.count_known(parts, counts)
    return found
