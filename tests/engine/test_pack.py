from context_assembler.contract.models import Chunk
from context_assembler.engine.candidate import Candidate
from context_assembler.engine.dedup import CopyDetector
from context_assembler.engine.pack import Packing, pack
from context_assembler.engine.policy import CompressPolicy, DedupPolicy, SelectPolicy
from context_assembler.engine.tokens import get_counter
from tests.factories import chunk


def run(chunks: list[Chunk], tokens: dict[str, int] | None, budget: int, *,
        compress: str = "off", question: str = "", **select: object) -> tuple[list[str], dict[str, str]]:
    """Pack with fixed per-chunk costs (or the cl100k count of the text)."""
    count = get_counter("cl100k_base").count

    def cost(candidate: Candidate, text: str) -> int:
        if tokens is not None and text == candidate.chunk.text:
            return tokens[candidate.chunk.chunk_id]
        return count(text)

    from context_assembler.engine.compress import extract_relevant

    packing = Packing(
        budget=budget,
        select=SelectPolicy.model_validate(select),
        compress=CompressPolicy.model_validate({"mode": compress}),
        cost=cost,
        shrink=lambda c: extract_relevant(c.chunk.text, question, 1),
    )
    kept, dropped = pack(
        [Candidate(i, c) for i, c in enumerate(chunks, start=1)], packing, CopyDetector(DedupPolicy())
    )
    assert len(kept) + len(dropped) == len(chunks)
    return [p.candidate.chunk.chunk_id for p in kept], {d.chunk_id: d.reason.value for d in dropped}


def test_skip_tries_the_next_passage_stop_ends_packing() -> None:
    chunks = [chunk("a", "alpha", doc_id="1"), chunk("b", "beta", doc_id="2"), chunk("c", "gamma", doc_id="3")]
    costs = {"a": 50, "b": 80, "c": 20}
    assert run(chunks, costs, 100, packing="skip") == (["a", "c"], {"b": "over_budget"})
    assert run(chunks, costs, 100, packing="stop") == (["a"], {"b": "over_budget", "c": "over_budget"})


def test_score_per_token_changes_the_winner_seed_002_example_4() -> None:
    chunks = [chunk("big", "big text", score=0.99, doc_id="1"),
              chunk("small1", "small one", score=0.90, doc_id="2"),
              chunk("small2", "small two", score=0.85, doc_id="3")]
    costs = {"big": 35, "small1": 12, "small2": 12}
    assert run(chunks, costs, 40, packing="skip")[0] == ["big"]
    assert run(chunks, costs, 40, packing="density")[0] == ["small1", "small2"]


def test_selection_under_a_tight_budget_seed_002_example_3() -> None:
    by_score = [
        ("policy-returns", 0.91, "Refunds are processed within five business days to the original payment method."),
        ("policy-warranty", 0.71, "Electronics carry a twelve month warranty covering manufacturing defects only."),
        ("faq-tracking", 0.65, "You can track your order with the tracking number in your confirmation email."),
        ("policy-shipping", 0.55, "Standard shipping is free for orders over 50 dollars and arrives in three to five days."),
        ("blog-holiday", 0.50, "During the holiday season our warehouse team works around the clock to pack every order with care and joy."),
    ]
    chunks = [chunk(cid, text, score=score) for cid, score, text in by_score]
    kept, dropped = run(chunks, None, 60)
    assert kept == ["policy-returns", "policy-warranty", "faq-tracking", "policy-shipping"]
    assert dropped == {"blog-holiday": "over_budget"}
    count = get_counter("cl100k_base").count
    assert sum(count(c.text) for c in chunks[:4]) == 58


def test_max_chunks_and_min_score() -> None:
    chunks = [chunk(c, c, score=s, doc_id=c) for c, s in (("a", 0.9), ("b", 0.8), ("c", 0.2))]
    assert run(chunks, None, 1000, max_chunks=1) == (["a"], {"b": "max_chunks", "c": "max_chunks"})
    assert run(chunks, None, 1000, min_score=0.5) == (["a", "b"], {"c": "below_min_score"})
    assert run(chunks, None, 1000, min_score=0.95)[0] == []


def test_a_copy_of_a_passage_that_did_not_fit_gets_its_own_chance() -> None:
    body = "The pump warranty of the pressure washer is three years from delivery."
    long_title = chunk("a", "A very long guide title\n" + body, doc_id="1", title="A very long guide title")
    short = chunk("b", "Guide\n" + body, doc_id="2", title="Guide")
    kept, dropped = run([long_title, short], {"a": 30, "b": 20}, 25)
    assert (kept, dropped) == (["b"], {"a": "over_budget"})
    kept, dropped = run([long_title, short], {"a": 20, "b": 20}, 45)
    assert (kept, dropped) == (["a"], {"b": "near_duplicate"})


def test_mmr_trades_relevance_for_diversity() -> None:
    pumps = "pump warranty three years pressure washer kit claim serial"
    chunks = [chunk("a", pumps + " form", score=0.9, doc_id="1"),
              chunk("b", pumps + " shop", score=0.85, doc_id="2"),  # Jaccard 0.82: not a copy
              chunk("c", "frost storage drain hoses garage winter", score=0.6, doc_id="3")]
    assert run(chunks, None, 1000, packing="skip", max_chunks=2)[0] == ["a", "b"]
    assert run(chunks, None, 1000, packing="mmr", mmr_lambda=0.5, max_chunks=2)[0] == ["a", "c"]


def test_overflow_compression_keeps_the_relevant_sentence() -> None:
    text = ("Pumps are covered for three years. Hoses are covered for one year. "
            "Our shop opens at nine. Parking is free on Sundays.")
    c = chunk("a", text)
    assert run([c], None, 10, question="how long are pumps covered")[0] == []
    kept, _ = run([c], None, 10, compress="overflow", question="how long are pumps covered")
    assert kept == ["a"]
