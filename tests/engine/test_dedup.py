from schemas.models import Chunk, DropReason
from tests.factories import chunk
from worker.engine.candidate import Candidate
from worker.engine.dedup import CopyDetector, drop_repeated_ids, prefix_length
from worker.engine.policy import DedupPolicy

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
    v3 = chunk("v3", "Returns policy\n" + RETURNS.format(d=30), doc_id="returns-policy")
    v4 = chunk("v4", "Returns policy\n" + RETURNS.format(d=45), doc_id="returns-policy")
    assert first_copy([v3, v4]) == {"v3": ("kept", None, 0.0), "v4": ("kept", None, 0.0)}
    # The rule that would have deleted the answer: 24 of 26 words shared.
    assert first_copy([v3, v4], same_document="dedup")["v4"] == ("near_duplicate", "v3", 0.923)


def test_identical_versions_of_one_document_stay_too() -> None:
    a = chunk("a", "Returns\nSame words.", doc_id="d")
    b = chunk("b", "Returns\nSame words.", doc_id="d")
    assert first_copy([a, b])["b"] == ("kept", None, 0.0)


def test_the_title_line_is_left_out_and_rank_decides_which_copy_stays() -> None:
    body = "Drain all water from the pump and hoses before the frost."
    a = chunk("pw2400", "PW-2400 guide\n" + body, doc_id="pw2400")
    b = chunk("pw2200", "PW-2200 guide\n" + body, doc_id="pw2200")
    assert first_copy([a, b])["pw2200"] == ("near_duplicate", "pw2400", 1.0)
    assert first_copy([a, b], drop_title_line=False)["pw2200"][0] == "kept"


def test_parts_lists_that_differ_in_part_numbers_stay_at_0_818() -> None:
    body = ("Spare parts\nOrder spare parts by number: the pump kit PK-{m}-{k}, the trigger "
            "gun TG-{m} and the hose HS-{m}, from the web shop.")
    a = chunk("p24", "PW-2400 guide\n" + body.format(m=2400, k="03"), doc_id="pw2400")
    b = chunk("p22", "PW-2200 guide\n" + body.format(m=2200, k="07"), doc_id="pw2200")
    assert first_copy([a, b])["p22"] == ("kept", None, 0.0)
    assert first_copy([a, b], near_threshold=0.8)["p22"] == ("near_duplicate", "p24", 0.818)


def test_exact_and_near_copies_seed_002_example_2() -> None:
    texts = {
        "policy-returns": "Refunds are processed within five business days to the original payment method.",
        "policy-returns-copy": "Refunds are processed within five business days to the original payment method.",
        "policy-returns-near": "Refunds are processed within 5 business days to the original payment method.",
        "policy-shipping": "Standard shipping is free for orders over 50 dollars and arrives in three to five days.",
        "blog-holiday": "During the holiday season our warehouse team works around the clock to pack every order with care and joy.",
        "faq-tracking": "You can track your order with the tracking number in your confirmation email.",
        "policy-warranty": "Electronics carry a twelve month warranty covering manufacturing defects only.",
    }
    decisions = first_copy([chunk(k, v) for k, v in texts.items()], near_threshold=0.8)
    assert decisions["policy-returns-copy"] == ("duplicate", "policy-returns", 1.0)
    assert decisions["policy-returns-near"] == ("near_duplicate", "policy-returns", 0.846)
    assert [k for k, v in decisions.items() if v[0] == "kept"] == [
        "policy-returns", "policy-shipping", "blog-holiday", "faq-tracking", "policy-warranty"]


def test_seed_004_dedupe_keeps_three_of_four() -> None:
    rows = ["The relocation cap for Berlin is 4000 EUR.",
            "Relocation cap for Berlin is 4000 EUR. Apply within 90 days of arrival.",
            "The relocation cap for Berlin is 4000 EUR.",
            "Parental leave is 14 weeks in Germany."]
    chunks = [chunk(f"p{i}", text, doc_id=f"d{i}") for i, text in enumerate(rows, start=1)]
    decisions = first_copy(chunks, near_threshold=0.7, drop_title_line=False)
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
