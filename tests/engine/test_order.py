import pytest

from context_assembler.engine.order import arrange, edges, first_last, round_robin


def test_edges_alternates_best_to_both_ends_seed_001() -> None:
    assert edges([1, 2, 3, 4, 5]) == [1, 3, 5, 4, 2]
    assert edges([1, 2]) == [1, 2]


def test_first_last_puts_the_second_best_last_seed_002() -> None:
    ranked = ["policy-returns", "policy-warranty", "faq-tracking", "policy-shipping"]
    assert first_last(ranked) == ["policy-returns", "faq-tracking", "policy-shipping", "policy-warranty"]
    assert first_last([1, 2]) == [1, 2]


def test_round_robin_takes_one_passage_per_source_per_round_seed_004() -> None:
    # Seed 004's input. Its own rule (and its code) gives this order; its prose lists
    # handbook(0.71) before wiki(0.62), which the one-per-source-per-round rule does not.
    ranked = [("handbook", 0.94), ("faq", 0.91), ("handbook", 0.71), ("wiki", 0.62)]
    assert round_robin(ranked, lambda p: p[0]) == [
        ("handbook", 0.94), ("faq", 0.91), ("wiki", 0.62), ("handbook", 0.71)]


def test_rank_keeps_the_order_and_unknown_modes_fail() -> None:
    assert arrange([3, 1, 2], "rank", str) == [3, 1, 2]
    with pytest.raises(AssertionError, match="random"):  # mypy rejects it before it runs
        arrange([1], "random", str)  # type: ignore[arg-type]
