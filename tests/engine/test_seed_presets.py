"""Seeds 002 and 004's worked examples, end to end, under the presets that claim them."""

from __future__ import annotations

from context_assembler.engine import assemble
from context_assembler.intake.policy_registry import load_preset
from tests.engine.test_dedup import SEED_002_EXAMPLE_2, SEED_004_ROWS
from tests.factories import chunk, event


def test_seed_002_example_2_under_window_8k() -> None:
    """The exact copy and the "5" for "five" rewording (Jaccard 0.846) both go; five stay."""
    chunks = [chunk(k, v) for k, v in SEED_002_EXAMPLE_2.items()]
    audit = assemble(event(chunks), load_preset("window-8k")).audit
    assert [(d.chunk_id, d.reason.value, d.duplicate_of, d.similarity) for d in audit.dropped] == [
        ("policy-returns-copy", "duplicate", "policy-returns", 1.0),
        ("policy-returns-near", "near_duplicate", "policy-returns", 0.8462),
    ]
    assert sorted(k.chunk_id for k in audit.kept) == sorted(
        ["policy-returns", "policy-shipping", "blog-holiday", "faq-tracking", "policy-warranty"])


def test_seed_002_leaves_no_line_out() -> None:
    """Seed 002 compares whole texts: two short guides whose first lines differ share 5 of
    7 words (0.714 < 0.8), where the default (title lines left out) calls them copies."""
    body = "Drain the pump."
    a = chunk("a", "PW-2400 guide\n" + body, doc_id="a", title="PW-2400 guide")
    b = chunk("b", "PW-2200 guide\n" + body, doc_id="b", title="PW-2200 guide")
    assert [k.chunk_id for k in assemble(event([a, b]), load_preset("window-8k")).audit.kept] == [
        "a", "b"]
    assert [k.chunk_id for k in assemble(event([a, b]), load_preset("default")).audit.kept] == ["a"]


def test_seed_004_dedupe_keeps_three_of_four_under_rank_fidelity() -> None:
    chunks = [chunk(f"p{i}", text, doc_id=f"d{i}") for i, text in enumerate(SEED_004_ROWS, start=1)]
    audit = assemble(event(chunks), load_preset("rank-fidelity")).audit
    assert sorted(k.chunk_id for k in audit.kept) == ["p1", "p2", "p4"]
    assert [(d.chunk_id, d.duplicate_of) for d in audit.dropped] == [("p3", "p1")]
