"""Budgets hold by a real tokenizer's count, whatever the text and the estimate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_assembler.contract.models import Message
from context_assembler.engine import assemble
from context_assembler.engine.policy import Policy
from context_assembler.engine.tokens import get_counter
from context_assembler.intake.policy_registry import load_preset
from tests.factories import chunk, event

CL100K = get_counter("cl100k_base")


def exact_prompt(messages: list[Message], overhead: int = 4) -> int:
    return sum(CL100K.count(m.content) + overhead for m in messages)


# Text an estimate counts badly: CJK without spaces, symbols, digits, mixed scripts.
HARD_TEXT = st.text(
    alphabet=st.sampled_from("漢字仮名交じり文の試験です😀€∑ЖΩ0123456789 .,;!?<>[]\n"),
    min_size=200, max_size=4000,
)


@settings(max_examples=40, deadline=None)
@given(st.lists(HARD_TEXT, min_size=1, max_size=12),
       st.sampled_from(["rank-fidelity", "estimated", "word-estimate"]))
def test_an_estimate_never_lets_the_prompt_exceed_the_window(texts: list[str], preset: str) -> None:
    policy = load_preset(preset)
    assert policy.budget.window is not None  # every preset has a window now
    request = event([chunk(f"c{i}", text, doc_id=f"d{i}") for i, text in enumerate(texts)])
    result = assemble(request, policy)
    limit = policy.budget.window - policy.budget.max_output
    assert exact_prompt(result.prompt.messages, policy.budget.message_overhead) <= limit
    assert result.prompt.tokens.prompt <= limit


def test_rank_fidelity_on_cjk_text_sheds_what_the_real_tokenizer_cannot_fit() -> None:
    # chars/4 thinks 40 chunks of 1,500 CJK characters cost 375 tokens each: 15,000 in all,
    # stop packing keeps ~18 of them by the estimate; cl100k counts each about 4x higher.
    texts = [("仮名交じり文の試験" * 170)[:1500] + f" {i}" for i in range(40)]
    request = event([chunk(f"c{i}", t, doc_id=f"d{i}", source=f"s{i % 3}") for i, t in enumerate(texts)])
    result = assemble(request, load_preset("rank-fidelity"))
    assert exact_prompt(result.prompt.messages) <= 8192 - 1024
    shed = [d for d in result.audit.dropped if "cl100k_base" in d.detail]
    assert shed, "the exact count must have shed passages the estimate let in"
    assert len(result.audit.kept) + len(result.audit.dropped) == 40


def test_words_times_1_3_counts_a_cjk_run_but_the_window_still_holds() -> None:
    text = "漢字" * 3000  # one "word" to words*1.3, thousands of real tokens
    result = assemble(event([chunk("cjk", text)]), load_preset("word-estimate"))
    assert exact_prompt(result.prompt.messages) <= 8192 - 1024
    assert [d.chunk_id for d in result.audit.dropped] == ["cjk"]


def test_ten_thousand_history_turns_are_cut_oldest_first_and_counted() -> None:
    turns = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n} about pumps"}
             for n in range(10_000)]
    request = event([chunk("a", "The pump is covered for 3 years.")], history=turns)
    result = assemble(request, Policy())
    limit = 8192 - 1024
    assert result.prompt.tokens.prompt <= limit
    assert exact_prompt(result.prompt.messages) <= limit
    history = result.prompt.messages[1:-1]
    assert history and history[-1].content == "turn 9999 about pumps"  # the most recent kept
    assert result.audit.history_turns_dropped == 10_000 - len(history)
    first_kept = int(history[0].content.split()[1])
    assert [m.content for m in history] == [f"turn {n} about pumps" for n in range(first_kept, 10_000)]


@pytest.mark.parametrize("encoding", ["chars/4", "words*1.3", "cl100k_base"])
def test_the_joined_context_recounts_within_the_budget(encoding: str) -> None:
    # Separators cost tokens too: under chars/4, passages of whole tokens plus "\n\n".
    texts = [f"Section {n:02}. The pump warranty lasts {n:02} years" + "!" * (n % 4) for n in range(60)]
    request = event([chunk(f"c{n}", t, doc_id=f"d{n}") for n, t in enumerate(texts)])
    counter = get_counter(encoding)  # type: ignore[arg-type]
    for budget in range(40, 400, 7):
        policy = Policy.model_validate(
            {"tokenizer": {"encoding": encoding}, "budget": {"context_tokens": budget}})
        result = assemble(request, policy)
        assert counter.count(result.prompt.context) <= budget, budget
        # Packing already paid for the separators: the final recount had nothing to shed.
        assert not any("joined context" in d.detail for d in result.audit.dropped), budget
