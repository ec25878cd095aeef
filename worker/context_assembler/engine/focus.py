"""Query-focused packing (`[compress] mode = "focused"`): the budget goes to the sentences
most likely to hold the answer, wherever they are, instead of to whole passages.

A passage's sentences come from its analysis (`sentences`: cut, word forms, marks). Each
sentence is scored against the question with lexical evidence:
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
passage is weighed by its word forms once, and analysed and scored at most once (only
once its best sentence could rank among those taken: `scored`), each sentence taken once.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Final

from context_assembler.contract.models import DropReason
from context_assembler.engine.candidate import Candidate, Drop
from context_assembler.engine.compress import ELISION
from context_assembler.engine.dedup import CopyDetector
from context_assembler.engine.facts import remember_terms
from context_assembler.engine.render import neutralise
from context_assembler.engine.sentences import (
    ANALYSES,
    DATE,
    LONGEST_CHARS,
    NAME,
    NOT_COUNTED,
    NUMBER,
    Analysis,
    Segment,
    SentenceCount,
    analyse,
    held_kinds,
    terms,
    title_terms,
)
from context_assembler.engine.words import is_cached, words

# What a question asks for, by its opening words.
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
    inside a word (`sentences._pieces`): then from its analysis. Remembered with the text's other
    facts where its word set would be."""
    if analysis is not None:
        return analysis.postings.keys()
    if candidate.facts.terms is not None:
        return _Joined(candidate.facts.terms)
    text = candidate.text
    held: AbstractSet[str] = (
        terms(text) if max(map(len, text.split(" "))) < LONGEST_CHARS
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
    held_by = [  # the question's forms each passage's text holds (its title aside)
        {term for term in question_terms if term in passage.terms}
        if isinstance(passage.terms, _Joined) else question_terms & passage.terms
        for passage in passages]
    shared_by = [sorted(question_terms & passage.titled | held)
                 for passage, held in zip(passages, held_by, strict=True)]
    idf = weights_of_terms(shared_by, question_terms)
    mass = sum(idf.values()) or 1.0
    share = {term: weight / mass for term, weight in idf.items()}  # what a match adds
    asked = asks_for(question)
    asking = _Question(frozenset(words(question)), asked, share, weights)
    prior = priors([p.candidate for p in passages])
    bases = [
        weights.passage * (sum(idf[t] for t in shared) / mass)
        + weights.prior * prior[passage.candidate.rank]
        for passage, shared in zip(passages, shared_by, strict=True)]
    if at_once:  # every passage scored first: one merge
        explicit: list[Ranked] = []
        streams: list[Iterator[Ranked]] = []
        for number, passage in enumerate(passages):
            open_passage(passage)
            found, groups = _segments_ranked(passage, number, bases[number], shared_by[number],
                                             asking)
            explicit += found
            streams += groups
        explicit.sort()
        yield from heapq.merge(explicit, *streams)
        return
    added_most = (weights.asked if asked else 0.0) + weights.opening + _SLACK
    queue: list[Queued] = [  # every passage at its bound
        (-(base + (1 + weights.neighbour) * sum(share[t] for t in shared if t in held)
           + added_most), number, _UNOPENED, None)
        for number, (held, shared, base) in enumerate(zip(held_by, shared_by, bases,
                                                          strict=True))]
    heapq.heapify(queue)
    while queue:
        key, number, index, rest = queue[0]
        if rest is None:  # a passage's bound: open it, queue its segments' streams instead
            heapq.heappop(queue)
            passage = passages[number]
            open_passage(passage)
            found, groups = _segments_ranked(passage, number, bases[number],
                                             shared_by[number], asking)
            found.sort()
            for stream in (iter(found), *groups):
                first = next(stream, None)
                if first is not None:
                    heapq.heappush(queue, (*first, stream))
            continue
        yield key, number, index
        following = next(rest, None)
        if following is None:
            heapq.heappop(queue)
        else:
            heapq.heapreplace(queue, (*following, rest))


def _segments_ranked(passage: _Passage, number: int, base: float, shared: list[str],
                     question: _Question) -> tuple[list[Ranked], list[Iterator[Ranked]]]:
    """An opened passage's segments: those scored one by one, unsorted, and its two groups
    of segments that share a score, each a stream in order (`scored`)."""
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
    explicit: list[Ranked] = []
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
        return explicit, []
    holding, others = analysis.split(asked)
    return explicit, [_group(-(base + asked_weight), number, holding, special),
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
