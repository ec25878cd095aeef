from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembler.contract.models import Chunk, DropReason
from context_assembler.engine import assemble
from context_assembler.engine.candidate import Candidate
from context_assembler.engine.dedup import CopyDetector, drop_repeated_ids, prefix_length
from context_assembler.engine.policy import DedupPolicy, Policy
from context_assembler.engine.words import (
    WORD,
    chunk_words,
    has_words,
    jaccard,
    signature,
    signature_slack,
)
from tests.factories import chunk, event, example, policy

RETURNS = ("Return window\nYou can return an unused item within {d} days of delivery for a "
           "refund to the original payment method, with the receipt or order number.")


def first_copy(chunks: list[Chunk], **policy: object) -> dict[str, tuple[str, str | None, float]]:
    """Keep everything that is not a copy of a kept chunk, in rank order."""
    detector = CopyDetector(DedupPolicy.model_validate(policy))
    decisions: dict[str, tuple[str, str | None, float]] = {}
    for rank, c in enumerate(chunks, start=1):
        candidate = Candidate(rank, c)
        twin = detector.find_twin(candidate)
        if twin is None:
            detector.add_kept(candidate)
            decisions[c.chunk_id] = ("kept", None, 0.0)
        else:
            decisions[c.chunk_id] = (twin.reason.value, twin.kept.chunk.chunk_id,
                                     round(twin.similarity, 3))
    return decisions


def test_two_versions_of_one_document_are_never_merged_seed_000() -> None:
    v3 = chunk("v3", "Returns policy\n" + RETURNS.format(d=30), doc_id="returns-policy", title="Returns policy")
    v4 = chunk("v4", "Returns policy\n" + RETURNS.format(d=45), doc_id="returns-policy", title="Returns policy")
    assert first_copy([v3, v4]) == {"v3": ("kept", None, 0.0), "v4": ("kept", None, 0.0)}
    # Seed 000's "changed rule" merges within a document; the number rule still keeps both...
    assert first_copy([v3, v4], same_document="dedup")["v4"] == ("kept", None, 0.0)
    # ...and without it, the answer is deleted: 24 of 26 words shared.
    assert first_copy([v3, v4], same_document="dedup", numbers_must_match=False)["v4"] == (
        "near_duplicate", "v3", 0.923)


def test_two_versions_of_one_document_are_both_kept_even_with_the_same_text() -> None:
    text = "Returns\nYou can return an unused item within 30 days."
    v3 = chunk("v3", text, doc_id="returns-policy", version="3")
    v4 = chunk("v4", text, doc_id="returns-policy", version="4")
    unversioned = chunk("v", text, doc_id="returns-policy")
    assert first_copy([v3, v4, unversioned]) == dict.fromkeys(["v3", "v4", "v"], ("kept", None, 0.0))


def test_exact_copies_within_one_document_and_version_are_duplicates() -> None:
    copies = [chunk(f"c{n}", "Returns\nSame words.", doc_id="d", version=version)
              for n, version in enumerate(["3", "3", None, None])]
    assert first_copy(copies) == {"c0": ("kept", None, 0.0), "c1": ("duplicate", "c0", 1.0),
                                  "c2": ("kept", None, 0.0), "c3": ("duplicate", "c2", 1.0)}
    # Seed 000 merges nothing within a document (the `estimated` preset's "keep").
    assert first_copy(copies, same_document="keep") == dict.fromkeys(
        ["c0", "c1", "c2", "c3"], ("kept", None, 0.0))


def test_copies_of_one_passage_cannot_crowd_the_answer_out_of_the_budget() -> None:
    filler = "Our stores are open from nine to five on weekdays and ten to four on Saturdays. " * 6
    copies = [chunk(f"copy{n}", filler, doc_id="faq") for n in range(4)]
    answer = chunk("answer", "Refunds reach the original payment method within 5 days.")
    one_copy = assemble(event([copies[0], answer]), policy(budget={"context_tokens": 10_000}))
    budget = one_copy.audit.tokens.context + 10  # room for one copy and the answer, no more
    result = assemble(event([*copies, answer]), policy(budget={"context_tokens": budget}))
    assert [k.chunk_id for k in result.audit.kept] == ["copy0", "answer"]
    assert {d.chunk_id: d.reason for d in result.audit.dropped} == dict.fromkeys(
        ["copy1", "copy2", "copy3"], DropReason.DUPLICATE)


def test_the_title_line_is_left_out_and_rank_decides_which_copy_stays() -> None:
    body = "Drain all water from the pump and hoses before the frost."
    a = chunk("pw2400", "PW-2400 guide\n" + body, doc_id="pw2400", title="PW-2400 guide")
    b = chunk("pw2200", "PW-2200 guide\n" + body, doc_id="pw2200", title="PW-2200 guide")
    assert first_copy([a, b])["pw2200"] == ("near_duplicate", "pw2400", 1.0)
    assert first_copy([a, b], drop_title_line="never")["pw2200"][0] == "kept"


def test_parts_lists_that_differ_in_part_numbers_stay_at_0_818() -> None:
    body = ("Spare parts\nOrder spare parts by number: the pump kit PK-{m}-{k}, the trigger "
            "gun TG-{m} and the hose HS-{m}, from the web shop.")
    a = chunk("p24", "PW-2400 guide\n" + body.format(m=2400, k="03"), doc_id="pw2400", title="PW-2400 guide")
    b = chunk("p22", "PW-2200 guide\n" + body.format(m=2200, k="07"), doc_id="pw2200", title="PW-2200 guide")
    assert first_copy([a, b])["p22"] == ("kept", None, 0.0)
    # Their part numbers differ, so even at 0.8 both stay; only without the rule is 0.818 a copy.
    assert first_copy([a, b], near_threshold=0.8)["p22"] == ("kept", None, 0.0)
    assert first_copy([a, b], near_threshold=0.8, numbers_must_match=False)["p22"] == (
        "near_duplicate", "p24", 0.818)


SEED_002_EXAMPLE_2 = {
    "policy-returns": "Refunds are processed within five business days to the original payment method.",
    "policy-returns-copy": "Refunds are processed within five business days to the original payment method.",
    "policy-returns-near": "Refunds are processed within 5 business days to the original payment method.",
    "policy-shipping": "Standard shipping is free for orders over 50 dollars and arrives in three to five days.",
    "blog-holiday": "During the holiday season our warehouse team works around the clock to pack every order with care and joy.",
    "faq-tracking": "You can track your order with the tracking number in your confirmation email.",
    "policy-warranty": "Electronics carry a twelve month warranty covering manufacturing defects only.",
}


def test_exact_and_near_copies_seed_002_example_2() -> None:
    chunks = [chunk(k, v) for k, v in SEED_002_EXAMPLE_2.items()]
    decisions = first_copy(chunks, near_threshold=0.8, numbers_must_match=False)
    assert decisions["policy-returns-copy"] == ("duplicate", "policy-returns", 1.0)
    assert decisions["policy-returns-near"] == ("near_duplicate", "policy-returns", 0.846)
    assert [k for k, v in decisions.items() if v[0] == "kept"] == [
        "policy-returns", "policy-shipping", "blog-holiday", "faq-tracking", "policy-warranty"]
    # By default "5" is a number the other passage lacks ("five" is a word): both stay.
    assert first_copy(chunks, near_threshold=0.8)["policy-returns-near"] == ("kept", None, 0.0)


SEED_004_ROWS = ["The relocation cap for Berlin is 4000 EUR.",
                 "Relocation cap for Berlin is 4000 EUR. Apply within 90 days of arrival.",
                 "The relocation cap for Berlin is 4000 EUR.",
                 "Parental leave is 14 weeks in Germany."]


def test_seed_004_dedupe_keeps_three_of_four() -> None:
    chunks = [chunk(f"p{i}", text, doc_id=f"d{i}") for i, text in enumerate(SEED_004_ROWS, start=1)]
    decisions = first_copy(chunks, near_threshold=0.7, drop_title_line="never")
    assert [k for k, v in decisions.items() if v[0] == "kept"] == ["p1", "p2", "p4"]


def test_embeddings_add_a_cosine_tier() -> None:
    a = chunk("a", "Refunds take five days.", doc_id="x", embedding=[1.0, 0.0, 0.1])
    b = chunk("b", "Money comes back within a working week.", doc_id="y", embedding=[0.99, 0.0, 0.12])
    assert first_copy([a, b])["b"][0] == "kept"
    decision = first_copy([a, b], cosine_threshold=0.98)["b"]
    assert decision[:2] == ("near_duplicate", "a") and decision[2] > 0.98


def test_a_repeated_chunk_id_is_one_passage() -> None:
    a, again = chunk("a", "one"), chunk("a", "one")
    kept, dropped = drop_repeated_ids([Candidate(1, a), Candidate(2, again)])
    assert [c.rank for c in kept] == [1]
    assert (dropped[0].rank, dropped[0].reason) == (2, DropReason.DUPLICATE)


def test_prefix_length_is_exact_at_float_edges() -> None:
    assert prefix_length(10, 0.9) == 2  # 0.9 * 10 must count as 9
    assert prefix_length(26, 0.9) == 3
    assert prefix_length(1, 0.9) == 1


WARRANTY = ("The pump of this model is covered for {n} months from the delivery date on the "
            "receipt, for defects in materials and workmanship only; wear parts are always excluded.")


def test_guides_that_differ_only_in_a_number_both_stay() -> None:
    """Reproduced: "12 months" and "24 months" shared 0.926 of their words and one was dropped."""
    a = chunk("garden", "Garden pump guide\n" + WARRANTY.format(n=12), doc_id="garden", title="Garden pump guide")
    b = chunk("pond", "Pond pump guide\n" + WARRANTY.format(n=24), doc_id="pond", title="Pond pump guide")
    assert first_copy([a, b]) == {"garden": ("kept", None, 0.0), "pond": ("kept", None, 0.0)}
    assert first_copy([a, b], numbers_must_match=False)["pond"] == ("near_duplicate", "garden", 0.926)


def test_the_same_numbers_said_again_are_still_a_copy() -> None:
    a = chunk("a", "Garden pump guide\n" + WARRANTY.format(n=12), doc_id="garden", title="Garden pump guide")
    b = chunk("b", "Pond pump guide\n" + WARRANTY.format(n=12) + " Again: 12 months.", doc_id="pond",
              title="Pond pump guide")
    assert first_copy([a, b])["b"] == ("near_duplicate", "a", 0.963)  # "again" is the new word
    same = chunk("c", a.text, doc_id="pond")
    assert first_copy([a, same])["c"] == ("duplicate", "a", 1.0)  # identical text: unaffected


def test_different_first_lines_of_faq_chunks_are_answers_not_titles() -> None:
    """Reproduced: the first line was always left out, so two different answers merged."""
    rest = ("Returns are free within the return window; bring the receipt or the order number "
            "to any store, or send the item back with the prepaid label from your account.")
    faq = {"title": "Returns FAQ", "doc_type": "faq"}
    yes = chunk("yes", "Yes, sale items can be returned like any other item.\n" + rest, doc_id="faq-a", **faq)
    no = chunk("no", "No, gift cards can never be returned or refunded.\n" + rest, doc_id="faq-b", **faq)
    assert first_copy([yes, no]) == {"yes": ("kept", None, 0.0), "no": ("kept", None, 0.0)}
    # Under a title line that is the title, the same bodies are one passage.
    a = chunk("a", "Returns FAQ\n" + rest, doc_id="faq-a", **faq)
    b = chunk("b", "Returns faq:\n" + rest, doc_id="faq-b", **faq)  # the same words
    assert first_copy([a, b])["b"] == ("near_duplicate", "a", 1.0)


def test_the_first_line_is_left_out_only_when_it_is_the_title() -> None:
    text = "PW-2400 Care Guide\nWinter storage\nEmpty the pump."
    body = {"winter", "storage", "empty", "the", "pump"}
    assert chunk_words(chunk("a", text, title="PW-2400 care guide"), drop_title_line="title").all == body
    assert chunk_words(chunk("a", text, title="PW-2400 care guide"), drop_title_line="never").all == body | {"pw", "2400", "care", "guide"}
    assert chunk_words(chunk("a", text), drop_title_line="title").all == body | {"pw", "2400", "care", "guide"}
    assert chunk_words(chunk("a", text, title="PW-2400"), drop_title_line="title").all == body | {"pw", "2400", "care", "guide"}
    one_line = chunk("a", "PW-2400 care guide", title="PW-2400 care guide")  # no body: nothing left out
    assert chunk_words(one_line, drop_title_line="title").all == {"pw", "2400", "care", "guide"}
    assert chunk_words(chunk("a", text, title="PW-2400 care guide"), drop_title_line="title").numbers == set()
    assert chunk_words(chunk("a", text), drop_title_line="title").numbers == {"2400"}


def test_seed_000_q30_and_parts_are_reproduced_with_the_example_texts() -> None:
    q30 = first_copy(list(example("q30-staff").chunks))
    assert q30["pw2200-winter"] == ("near_duplicate", "pw2400-winter", 1.0)
    assert [k for k, v in q30.items() if v[0] == "kept"] == [
        "wcp-3-pumps", "wp-2-periods", "pw2400-winter", "pw2400-safety"]
    parts = list(example("parts").chunks)
    assert first_copy(parts)["pw2200-parts"] == ("kept", None, 0.0)
    assert first_copy(parts, near_threshold=0.8, numbers_must_match=False)["pw2200-parts"] == (
        "near_duplicate", "pw2400-parts", 0.818)
    dropped = assemble(example("q30-staff"), Policy()).audit.dropped
    assert [(d.chunk_id, d.detail, d.similarity) for d in dropped] == [(
        "pw2200-winter", "near-duplicate of pw2400-winter (rank 3), jaccard 1.000", 1.0)]


PROSE = st.lists(st.sampled_from("the pump hose kit warranty months covers delivery receipt parts of a for".split()),
                 min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(PROSE, st.integers(0, 40), st.lists(st.integers(0, 99_999), min_size=2, max_size=2, unique=True),
       st.lists(st.integers(0, 99_999), max_size=3), st.booleans(), st.sampled_from(["", ".5", "%"]))
def test_texts_that_differ_in_a_number_are_never_near_duplicates(
    prose: list[str], at: int, pair: list[int], shared: list[int], titled: bool, suffix: str
) -> None:
    """Two chunks of different documents whose texts differ in a number: both stay."""
    def text(number: int) -> str:
        body = [*prose, *(str(n) for n in shared if n not in pair)]
        body.insert(at % (len(body) + 1), f"{number}{suffix}")
        return "Pump guide\n" + " ".join(body)

    title = "Pump guide" if titled else None
    a = chunk("a", text(pair[0]), doc_id="d1", title=title)
    b = chunk("b", text(pair[1]), doc_id="d2", title=title)
    result = assemble(event([a, b]), Policy())
    assert all(d.reason is not DropReason.NEAR_DUPLICATE for d in result.audit.dropped)
    assert [k.chunk_id for k in result.audit.kept] == ["a", "b"]
    if jaccard(chunk_words(a, drop_title_line="title").all, chunk_words(b, drop_title_line="title").all) >= 0.9:
        off = policy(dedup={"numbers_must_match": False})  # the rule is what keeps both
        assert [d.reason for d in assemble(event([a, b]), off).audit.dropped] == [DropReason.NEAR_DUPLICATE]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list(" .,-\n\t_aZ9é—…中"))), st.integers(0, 100))
def test_has_words_agrees_with_the_regex_at_any_offset(text: str, padding: int) -> None:
    text = "." * padding + text  # the first word may lie past the fast path's first 64 characters
    assert has_words(text) == (WORD.search(text) is not None)


# Words drawn from a vocabulary of 300, so that sets of a few dozen words overlap a lot or little.
VOCABULARY = [f"w{i}" for i in range(300)]
WORD_SETS = st.frozensets(st.sampled_from(VOCABULARY), max_size=120)


@settings(max_examples=500, deadline=None)
@given(WORD_SETS, WORD_SETS, st.data(), st.sampled_from([0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 1.0]))
def test_signatures_rule_out_only_pairs_below_the_threshold(
    a: frozenset[str], extra: frozenset[str], data: st.DataObject, t: float
) -> None:
    """The sketch test is exact: a pair it rules out is never a near-duplicate."""
    dropped = data.draw(st.sets(st.sampled_from(sorted(a)), max_size=5)) if a else set()
    b = (a - dropped) | frozenset(sorted(extra)[: data.draw(st.integers(0, 8))])  # often near
    least = t - 1e-9
    differ = (signature(a) ^ signature(b)).bit_count()
    if differ > (len(a) + len(b)) * signature_slack(least) + 0.5:
        assert jaccard(a, b) < least


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(VOCABULARY), min_size=4, max_size=12), min_size=40, max_size=60),
       st.lists(st.tuples(st.integers(0, 59), st.sampled_from(VOCABULARY)), max_size=20),
       st.sampled_from([0.5, 0.8, 0.9, 1.0]))
def test_past_the_scan_limit_the_prefix_index_finds_what_a_full_scan_finds(
    bases: list[list[str]], edits: list[tuple[int, str]], t: float
) -> None:
    """More than SCAN_LIMIT kept chunks: the prefix index takes over from the sketches, and
    near copies (an earlier text with a word more) come late."""
    texts = [" ".join(words) for words in bases]
    texts += [f"{texts[at % len(texts)]} {word}" for at, word in edits]
    detector = CopyDetector(DedupPolicy(near_threshold=t, numbers_must_match=False))
    kept: list[Candidate] = []
    for rank, text in enumerate(texts, start=1):
        candidate = Candidate(rank, chunk(f"c{rank}", text))
        words = chunk_words(candidate.chunk, drop_title_line="title").all
        expected = [
            k for k in kept if k.chunk.text != text
            and jaccard(words, chunk_words(k.chunk, drop_title_line="title").all) >= t - 1e-9
        ]
        identical = [k for k in kept if k.chunk.text == text]
        twin = detector.find_twin(candidate)
        if identical or expected:
            assert twin is not None and twin.kept is (identical or expected)[0]
        else:
            assert twin is None
            detector.add_kept(candidate)
            kept.append(candidate)
