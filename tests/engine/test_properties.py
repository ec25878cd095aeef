"""Invariants over generated events and policies (hypothesis)."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_assembler.contract.models import AssembledPrompt, RetrievalResult
from context_assembler.engine import Assembly, PromptTooLarge, assemble
from context_assembler.engine.candidate import Candidate
from context_assembler.engine.dedup import CopyDetector
from context_assembler.engine.policy import DedupPolicy, Policy, policy_from_mapping
from context_assembler.engine.tokens import EXACT_TOKENIZERS, get_counter
from context_assembler.engine.words import chunk_words, jaccard
from context_assembler.intake.codec import encode
from tests.factories import chunk

# A small vocabulary makes near-duplicates and identical texts common.
WORDS = st.sampled_from(["pump", "hose", "kit", "warranty", "years", "days", "refund", "policy", "staff", "frost", "the", "a", "of", "30", "45", "PW-2200", "PW-2400", "</documents>", "[S1]"])
TEXT = st.lists(WORDS, min_size=0, max_size=25).map(" ".join)
DAY = st.integers(0, 60).map(lambda n: date(2026, 1, 1) + timedelta(days=n))


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    start = draw(st.none() | DAY)
    return {
        "chunk_id": draw(st.sampled_from([f"c{i}" for i in range(12)])),
        "doc_id": draw(st.none() | st.sampled_from(["d1", "d2", "d3"])),
        "text": draw(st.sampled_from(["Title A", "Title B"])) + "\n" + draw(TEXT),
        "score": draw(st.none() | st.floats(-2, 2)),
        "title": draw(st.none() | st.sampled_from(["Guide", "Policy", "Title A"])),
        "source": draw(st.none() | st.sampled_from(["s1", "s2"])),
        "version": draw(st.none() | st.sampled_from(["3", "4"])),
        "effective_from": start,
        "effective_to": None if start is None else draw(st.none() | st.just(start + timedelta(days=20))),
        "audience": draw(st.sampled_from([[], ["staff"], ["staff", "customer"]])),
    }


@st.composite
def events(draw: st.DrawFn) -> RetrievalResult:
    return RetrievalResult.model_validate({
        "request_id": "r",
        "question": draw(TEXT),
        "chunks": draw(st.lists(chunks(), max_size=14)),
        "audience": draw(st.none() | st.sampled_from(["staff", "customer"])),
        "as_of": draw(st.none() | DAY),
        "history": draw(st.lists(st.fixed_dictionaries({
            "role": st.sampled_from(["user", "assistant"]), "content": TEXT}), max_size=3)),
    })


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    window = draw(st.booleans())
    budget: dict[str, Any] = (
        {"window": draw(st.integers(300, 3000)), "max_output": draw(st.integers(0, 200)),
         "history_share": draw(st.sampled_from([0.0, 0.4]))}
        if window else {"context_tokens": draw(st.integers(1, 400))}
    )
    if window and draw(st.booleans()):
        budget["context_tokens"] = draw(st.integers(1, 400))
    budget["charge_separators"] = draw(st.booleans())
    return policy_from_mapping({
        "tokenizer": {"encoding": draw(st.sampled_from(["chars/4", "words*1.3", "cl100k_base"]))},
        "budget": budget,
        "dedup": {"near_threshold": draw(st.sampled_from([0.5, 0.8, 0.9, 1.0])),
                  "same_document": draw(st.sampled_from(["keep", "dedup"])),
                  "drop_title_line": draw(st.sampled_from(["title", "always", "never"])),
                  "numbers_must_match": draw(st.booleans())},
        "select": {"packing": draw(st.sampled_from(["skip", "stop", "density", "mmr"])),
                   "max_chunks": draw(st.none() | st.integers(1, 5)),
                   "min_score": draw(st.none() | st.floats(-1, 1))},
        "compress": {"mode": draw(st.sampled_from(["off", "overflow", "always", "focused"]))},
        "order": {"mode": draw(st.sampled_from(["rank", "edges", "first_last", "round_robin_source"]))},
        "render": {"labels": draw(st.sampled_from(["chunk_id", "S{n}", "{n}"])),
                   "header": draw(st.sampled_from(["full", "source_section", "inline_section", "id_score"]))},
    })


def exact_prompt_tokens(prompt: AssembledPrompt, policy: Policy) -> int:
    """The whole prompt recounted from its messages with a real tokenizer."""
    name = policy.tokenizer.encoding
    exact = get_counter(name if name in EXACT_TOKENIZERS else policy.tokenizer.exact_encoding)
    overhead = policy.budget.message_overhead
    return sum(exact.count(message.content) + overhead for message in prompt.messages)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assemble_unless_too_large(event: RetrievalResult, policy: Policy) -> Assembly | None:
    """The assembly, or None for PromptTooLarge, checked to come only when instructions and
    question alone are over window - max_output."""
    try:
        return assemble(event, policy)
    except PromptTooLarge:
        bare = assemble(event.model_copy(update={"chunks": [], "history": []}), policy_from_mapping(
            {"budget": {"window": None, "context_tokens": 1}}, base=policy))
        assert policy.budget.window is not None
        limit = policy.budget.window - policy.budget.max_output
        assert max(bare.prompt.tokens.prompt, exact_prompt_tokens(bare.prompt, policy)) > limit
        return None


@SETTINGS
@given(events(), policies())
def test_invariants(event: RetrievalResult, policy: Policy) -> None:
    result = assemble_unless_too_large(event, policy)
    if result is None:
        return
    audit, prompt = result.audit, result.prompt

    # Every input chunk is accounted for exactly once.
    ranks = sorted([k.rank for k in audit.kept] + [d.rank for d in audit.dropped])
    assert ranks == list(range(1, len(event.chunks) + 1))

    # Never over budget: the joined context, or where separators are not charged, the
    # passages' own costs; with a window, the whole prompt fits window - max_output.
    charged = (audit.tokens.context if policy.budget.charge_separators
               else sum(k.tokens for k in audit.kept))
    assert charged <= audit.tokens.budget
    if policy.budget.window is not None:
        assert audit.tokens.prompt <= policy.budget.window - policy.budget.max_output
        # An estimate never decides what fits: the exact count fits as well.
        assert exact_prompt_tokens(prompt, policy) <= policy.budget.window - policy.budget.max_output
    assert audit.history_turns_dropped == len(event.history) - (len(prompt.messages) - 2)
    if policy.select.max_chunks is not None:
        assert len(audit.kept) <= policy.select.max_chunks

    # Nothing the reader may not see, nothing out of force.
    for kept in audit.kept:
        source = event.chunks[kept.rank - 1]
        if event.audience is not None and source.audience:
            assert event.audience in source.audience
        if event.as_of is not None and source.effective_from is not None:
            assert source.effective_from <= event.as_of

    # Labels are dense and in context order; citations mirror the kept list.
    labels = [k.label for k in audit.kept]
    if policy.render.labels == "S{n}":
        assert labels == [f"S{n}" for n in range(1, len(labels) + 1)]
    assert [c.label for c in prompt.citations] == labels
    assert prompt.abstained == (not audit.kept)
    if policy.order.mode == "rank":
        assert [k.rank for k in audit.kept] == sorted(k.rank for k in audit.kept)

    # No two kept passages are copies under the policy's rules.
    texts = [event.chunks[k.rank - 1] for k in audit.kept]
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if policy.dedup.same_document == "keep" and a.document == b.document:
                continue
            assert a.text != b.text
            if policy.dedup.near:
                wa = chunk_words(a, drop_title_line=policy.dedup.drop_title_line)
                wb = chunk_words(b, drop_title_line=policy.dedup.drop_title_line)
                # Both stay when one holds a number the other lacks (numbers_must_match).
                numbers_differ = policy.dedup.numbers_must_match and wa.numbers != wb.numbers
                assert numbers_differ or jaccard(wa.all, wb.all) < policy.dedup.near_threshold - 1e-9

    # The question is the last thing the model reads.
    assert prompt.messages[-1].role == "user"

    # Determinism: the same event and policy give the same bytes.
    again = assemble(event, policy)
    assert encode(again.prompt) == encode(prompt) and encode(again.audit) == encode(audit)


@SETTINGS
@given(st.lists(TEXT, max_size=20), st.sampled_from([0.3, 0.5, 0.7, 0.8, 0.9, 1.0]))
def test_prefix_filter_finds_exactly_the_pairs_a_full_scan_finds(texts: list[str], t: float) -> None:
    detector = CopyDetector(DedupPolicy(near_threshold=t, drop_title_line="never", numbers_must_match=False))
    kept: list[Candidate] = []
    for rank, text in enumerate(texts, start=1):
        candidate = Candidate(rank, chunk(f"c{rank}", text or "empty"))
        words = chunk_words(candidate.chunk, drop_title_line="never").all
        expected = [k for k in kept if k.chunk.text != candidate.chunk.text
                    and jaccard(words, chunk_words(k.chunk, drop_title_line="never").all) >= t - 1e-9]
        identical = [k for k in kept if k.chunk.text == candidate.chunk.text]
        twin = detector.find_twin(candidate)
        if identical:
            assert twin is not None and twin.kept is identical[0]
        elif expected:
            assert twin is not None and twin.kept is expected[0]  # the best-ranked kept copy
        else:
            assert twin is None
            detector.add_kept(candidate)
            kept.append(candidate)
