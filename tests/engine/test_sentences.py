"""A passage cut into sentences for focused compression: its segments, word forms and marks."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_assembler.engine.candidate import Candidate
from context_assembler.engine.sentences import (
    DATE,
    NAME,
    NUMBER,
    analyse,
    held_kinds,
    marks_of,
    segments,
    stem,
    terms,
)
from context_assembler.engine.tokens import get_counter
from tests.factories import chunk

COUNTER = get_counter("cl100k_base")


def test_word_forms_meet() -> None:
    assert stem("released") == stem("release") == stem("releases") == stem("releasing")
    assert stem("movies") == stem("movie")
    assert stem("countries") == stem("country")
    assert stem("glass") == "glass" and stem("bus") == "bus"
    assert terms("When was the movie released?") == frozenset({"movi", "releas"})


def test_what_kind_of_answer_a_sentence_holds_beyond_the_question() -> None:
    asked = frozenset({"season", "5"})
    def kinds(sentence: str) -> int:
        return held_kinds(marks_of(sentence), asked)

    assert kinds("It was released on May 18, 2018.") & DATE
    assert kinds("The season has twelve episodes.") & NUMBER
    assert not kinds("Season 5 is good.") & NUMBER  # 5 is the question's own
    assert kinds("The song was sung by Dick Powell.") & NAME
    assert not kinds("the song was sung by him.")


def test_a_sentence_that_starts_with_a_pronoun_leans_on_the_one_before() -> None:
    found = segments("Deadpool 2 is a film. It was released in May. Sales were high.",
                     COUNTER.count)
    assert [s.text for s in found] == ["Deadpool 2 is a film.", "It was released in May.",
                                       "Sales were high."]
    assert [s.leans for s in found] == [False, True, False]
    assert [s.text for s in segments("He met J. Smith in the U.S. Army. Done.",
                                     COUNTER.count)] == ["He met J. Smith in the U.S. Army.",
                                                         "Done."]


def test_a_long_sentence_is_taken_in_pieces_of_its_own_text() -> None:
    sentence = " ".join(f"word{n}" for n in range(300)) + "."
    found = segments(sentence, COUNTER.count)
    assert len(found) > 1
    assert " ".join(s.text for s in found) == sentence
    assert all(COUNTER.count(s.text) <= 2 * 64 for s in found)


# Parts of passages that ASCII and other text handle apart: capitals that lower-case to two
# characters or to ASCII, final sigma, other scripts' digits, blanks that end a line or not,
# words past the 32 characters whose forms are cached, sentences cut into pieces; among
# plain words, so that most sentences hold no mark, as in prose.
PASSAGE_PARTS = st.sampled_from([
    *[" "] * 12, *["the", "pump", "Smith", "It", "water", "runs", "of", ". "] * 3,
    "it", "He", "However", "may", "May", "MAY", "two", "Two", "1998", "1990s", "21st", "J.",
    "U.S.", "(May", "March,", '"Smith"', "first.", "hundred", "released", "releases",
    "glasses", "a", "İstanbul", "\u212aelvin", "ΑΣ", "é", "²", "\u0661", "…", "x" * 40,
    "long" * 40, "  ", "? ", ".\n", "\n", "\t", "\xa0", "\u2028", "! ", ") ",
])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PASSAGE_PARTS, min_size=1, max_size=120).map("".join))
def test_an_analysis_finds_in_each_segment_what_the_segment_alone_says(text: str) -> None:
    """A passage is analysed at once (its words found in one pass, its markless sentences
    skipped), and what the analysis holds of each segment is what that segment's text says
    read alone: its marks and kinds of answer, the word forms it is indexed under."""
    if not text.strip():
        return
    found = analyse(Candidate(1, chunk("c", text)), COUNTER.count, COUNTER.name)
    indexed: dict[str, list[int]] = {}
    for index, segment in enumerate(found.segments):
        assert segment.marks == marks_of(segment.text)
        kinds = 0
        for _, kind in segment.marks:
            kinds |= kind
        assert found.kinds[index] == kinds
        for term in sorted(terms(segment.text)):
            indexed.setdefault(term, []).append(index)
    assert {term: list(held) for term, held in found.postings.items()} == indexed
