"""The citation check: every label of the prompt resolves, any other is reported, the
answer's citations keep their order and count; hostile answers are read as a reader sees
them; the work and the result are bounded by what was read."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import context_assembler as ca
from context_assembler.contract.models import (
    AnthropicRequest,
    AnthropicSearchResult,
    AssembledPrompt,
)
from context_assembler.engine import citations
from context_assembler.engine.citations import (
    CITATION_CHARS,
    ENTRY_CHARS,
    MAX_CITATIONS,
    OUTPUT_FACTOR,
    check_citations,
)
from context_assembler.engine.policy import policy_from_mapping
from context_assembler.intake.codec import encode
from tests.factories import example
from tests.support.cpu_ratios import best_times, ratios_until_within

ROOMY = {"budget": {"context_tokens": 100_000, "window": None}}
_ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789-.#/:"
ids = st.text(_ID_CHARS, min_size=1, max_size=12)
prose = st.text("abcdefghij klmnop.", max_size=30)


def prompt_with(chunk_ids: list[str], **render: str) -> AssembledPrompt:
    event = ca.RetrievalResult.model_validate({
        "request_id": "r", "question": "Which?",
        "chunks": [{"chunk_id": chunk_id, "text": f"Passage {n} says {n * 7} things.",
                    "doc_id": f"doc-{n}", "source": f"src/{n}.md", "version": str(n)}
                   for n, chunk_id in enumerate(chunk_ids)],
    })
    policy = policy_from_mapping({**ROOMY, "render": render, "dedup": {"near": False}})
    prompt = ca.assemble(event, policy).prompt
    assert len(prompt.citations) == len(chunk_ids)
    return prompt


def labels_of(prompt: AssembledPrompt) -> list[str]:
    return [citation.label for citation in prompt.citations]


# How a marker may be written: as is, and as hostile answers disguise it.
DISGUISES: dict[str, Callable[[str], str]] = {
    "plain": lambda label: f"[{label}]",
    "fullwidth brackets": lambda label: f"\uff3b{label}\uff3d",
    "small brackets": lambda label: f"\ufe47{label}\ufe48",
    "zero-width inside": lambda label: f"[{label[:1]}\u200b{label[1:]}\u2060]",
    "variation selector": lambda label: f"[\ufe0f{label}]",
    "markup split": lambda label: f"[{label[:1]}<b>{label[1:]}</b>]",
    "emphasis split": lambda label: f"[**{label[:1]}**{label[1:]}]",
    "upper case": lambda label: f"[{label.upper()}]",
    "fullwidth letters": lambda label: "[" + "".join(
        chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in label) + "]",
    "blanks inside": lambda label: f"[ {label[:1]} {label[1:]} ]",
    "link": lambda label: f"[{label}](https://example.com/{label})",
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chunk_ids=st.lists(ids, min_size=1, max_size=6, unique=True),
       scheme=st.sampled_from(["chunk_id", "S{n}", "{n}"]))
def test_every_label_resolves_in_the_answers_order_and_count(
    data: st.DataObject, chunk_ids: list[str], scheme: str
) -> None:
    prompt = prompt_with(chunk_ids, labels=scheme)
    labels = labels_of(prompt)
    picks = data.draw(st.lists(st.sampled_from(labels), max_size=12))
    disguise = data.draw(st.sampled_from(sorted(DISGUISES)))
    words = data.draw(st.lists(prose, min_size=len(picks) + 1, max_size=len(picks) + 1))
    answer = words[0] + "".join(f" {DISGUISES[disguise](label)} {word}"
                                for label, word in zip(picks, words[1:], strict=True))
    result = check_citations(answer, prompt)
    assert [cited.label for cited in result.cited] == picks
    assert result.invented == []
    assert result.uncited == [label for label in labels if label not in picks]
    by_label = {c.label: c for c in prompt.citations}
    for cited in result.cited:
        source = by_label[cited.label]
        assert (cited.chunk_id, cited.doc_id, cited.source, cited.version) == (
            source.chunk_id, source.doc_id, source.source, source.version)


def _key(label: str) -> str:
    """How the check tells labels apart: what a reader takes them for."""
    return citations._key(label)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), chunk_ids=st.lists(ids, min_size=1, max_size=5, unique=True))
def test_any_other_label_is_reported_however_it_is_disguised(
    data: st.DataObject, chunk_ids: list[str]
) -> None:
    prompt = prompt_with(chunk_ids)
    labels = labels_of(prompt)
    taken = {_key(label) for label in labels}
    others = data.draw(st.lists(ids.filter(lambda other: _key(other) not in taken),
                                min_size=1, max_size=4))
    mixed = data.draw(st.permutations([*(("real", label) for label in labels),
                                       *(("other", other) for other in others)]))
    disguise = data.draw(st.sampled_from(sorted(DISGUISES)))
    answer = " and ".join(DISGUISES[disguise](label) for _, label in mixed)
    result = check_citations(answer, prompt)
    assert [c.label for c in result.cited] == [label for kind, label in mixed if kind == "real"]
    assert [_key(label) for label in result.invented] == list(
        dict.fromkeys(_key(label) for kind, label in mixed if kind == "other"))
    assert result.uncited == []


def test_one_marker_may_name_several_labels() -> None:
    prompt = prompt_with(["a-1", "b-2", "c-3"])
    result = check_citations("Yes [a-1, c-3; zz] and [b-2].", prompt)
    assert [c.label for c in result.cited] == ["a-1", "c-3", "b-2"]
    assert result.invented == ["zz"] and result.uncited == []


def test_an_invented_label_cannot_hide_behind_any_disguise() -> None:
    prompt = prompt_with(["S1x"])
    for name, disguise in DISGUISES.items():
        result = check_citations(f"Claim {disguise('s9')}.", prompt)
        assert [_key(label) for label in result.invented] == ["s9"], name
        assert result.cited == []


def test_a_label_split_across_markup_or_a_line_resolves() -> None:
    prompt = prompt_with(["wp-2-periods"])
    for answer in ("[wp-2-<span class='x'>periods</span>]", "[wp-2-\nperiods]",
                   "<b>[</b>wp-2-periods]", "[wp\u00ad-2\u200d-periods]"):
        assert [c.label for c in check_citations(answer, prompt).cited] == ["wp-2-periods"]


def test_bracketed_prose_is_reported_and_long_prose_is_not_a_label() -> None:
    prompt = prompt_with(["a"])
    result = check_citations("[citation needed] [" + "x " * 300 + "] [[a]] [] [ ]", prompt)
    assert result.invented == ["citation needed"]
    assert [c.label for c in result.cited] == ["a"]


def test_the_prompt_may_be_given_as_its_json() -> None:
    prompt = prompt_with(["a", "b"])
    as_json = json.loads(encode(prompt))
    assert check_citations("[b]", as_json) == check_citations("[b]", prompt)
    with pytest.raises(ca.UnreadableAnswer, match="not an AssembledPrompt"):
        check_citations("[b]", {"request_id": "r"})


# --------------------------------------------------------------------- provider responses


def anthropic_response(citations: list[dict[str, Any]], text: str = "Three years.") -> dict[str, Any]:
    return {"id": "m", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "Pumps: "},
                        {"type": "text", "text": text, "citations": citations}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}


def location(index: int, title: str | None = None, source: str | None = None) -> dict[str, Any]:
    return {"type": "search_result_location", "search_result_index": index, "source": source,
            "title": title, "cited_text": "x", "start_block_index": 0, "end_block_index": 1}


def test_anthropic_citations_resolve_by_search_result_index() -> None:
    event = example("q30-customer")
    prompt = ca.assemble(event, policy_from_mapping({"render": {"format": "anthropic"}})).prompt
    request = prompt.provider_request
    assert isinstance(request, AnthropicRequest)
    blocks = request.messages[-1].content
    results = [block for block in blocks if isinstance(block, AnthropicSearchResult)]
    titles = [result.title for result in results]
    response = anthropic_response([location(2, titles[2], results[2].source),
                                   location(0, titles[0]), location(2), location(7, "x"),
                                   location(1, "a forged title"),
                                   location(1, titles[1], "forged/source.md"),
                                   {"type": "char_location"}],
                                  text="Three years [S9].")
    result = check_citations(response, prompt)
    labels = labels_of(prompt)
    assert [c.label for c in result.cited] == [labels[2], labels[0], labels[2]]
    assert result.invented == ["search_result_index 7", "search_result_index 1",
                               "char_location citation", "S9"]
    assert result.uncited == [labels[1]]


def test_cohere_citations_resolve_by_document_id() -> None:
    prompt = prompt_with(["a-1", "b-2"], format="cohere")
    response = {"id": "c", "finish_reason": "COMPLETE", "message": {
        "role": "assistant", "content": [{"type": "text", "text": "Yes [a-1] [q]."}],
        "citations": [
            {"start": 0, "end": 3, "text": "Yes", "type": "TEXT_CONTENT",
             "sources": [{"type": "document", "id": "b-2", "document": {}},
                         {"type": "document", "id": "nope"}]},
            {"start": 0, "end": 3, "text": "Yes", "sources": [{"type": "document", "id": "b-2"}]},
        ]}}
    result = check_citations(response, prompt)
    assert [c.label for c in result.cited] == ["b-2", "b-2"]
    assert result.invented == ["nope", "q"]  # the citation objects, then the text's markers
    assert result.uncited == ["a-1"]


def test_an_answer_of_no_known_shape_is_unreadable() -> None:
    prompt = prompt_with(["a"])
    answers: list[dict[str, Any]] = [{"choices": []}, {"content": "text"}, {"message": "text"}]
    for answer in answers:
        with pytest.raises(ca.UnreadableAnswer, match="neither text nor a provider response"):
            check_citations(answer, prompt)


def test_a_hostile_response_shape_is_read_without_error() -> None:
    prompt = prompt_with(["a"])
    odd: dict[str, Any] = {"content": [None, 1, {"text": 5}, {"type": "text", "text": "[a]",
                                                             "citations": [1, None, {"search_result_index": True}]}]}
    result = check_citations(odd, prompt)
    assert result.cited == [] and result.invented == ["None citation"]
    cohere_odd: dict[str, Any] = {"message": {"citations": [None, {"sources": [7, {"id": 3}]}],
                                              "content": None}}
    assert check_citations(cohere_odd, prompt).invented == ["source without an id"]


# -------------------------------------------------------------------------------- bounds


def test_an_answer_over_its_size_bound_is_refused() -> None:
    prompt = prompt_with(["a"])
    with pytest.raises(ca.UnreadableAnswer, match="max_answer_chars=10"):
        check_citations("x" * 11, prompt, max_answer_chars=10)
    response = anthropic_response([], text="y" * 11)
    with pytest.raises(ca.UnreadableAnswer, match="max_answer_chars=10"):
        check_citations(response, prompt, max_answer_chars=10)


def test_more_citations_than_the_bound_are_refused() -> None:
    prompt = prompt_with(["a"])
    assert len(check_citations("[a]" * MAX_CITATIONS, prompt).cited) == MAX_CITATIONS
    with pytest.raises(ca.UnreadableAnswer, match="max_citations"):
        check_citations("[a]" * (MAX_CITATIONS + 1), prompt)
    with pytest.raises(ca.UnreadableAnswer, match="max_citations"):
        check_citations(anthropic_response([location(0)] * 3), prompt, max_citations=2)


def _chars(result: ca.CitationCheck) -> int:
    return len(result.model_dump_json())


@settings(max_examples=40, deadline=None)
@given(unit=st.sampled_from(["[a]", "[a][zz]", "\uff3ba\uff3d", "[q1][q2][q3]", "[a, b, a]"]),
       repeats=st.integers(1, 1000), source=st.integers(0, 3000))
def test_the_result_is_a_small_multiple_of_what_was_read(
    unit: str, repeats: int, source: int
) -> None:
    """Dense citations of long citations are refused rather than multiplied."""
    event = ca.RetrievalResult.model_validate({"request_id": "r", "question": "q", "chunks": [
        {"chunk_id": "a", "text": "One.", "source": "s" * source},
        {"chunk_id": "b", "text": "Two 2.", "version": "v" * source}]})
    prompt = ca.assemble(event, policy_from_mapping(ROOMY)).prompt
    answer = unit * repeats
    read = len(answer) + sum(len(c.model_dump_json()) for c in prompt.citations)
    try:
        result = check_citations(answer, prompt)
    except ca.UnreadableAnswer as error:
        assert "times the answer" in str(error)
        return
    assert _chars(result) <= OUTPUT_FACTOR * read + 200


def test_the_bound_constants_cover_json_framing() -> None:
    prompt = prompt_with(["a"])
    cited = check_citations("[a]", prompt).cited[0]
    fields = (cited.label, cited.chunk_id, cited.doc_id, cited.source, cited.version)
    assert len(cited.model_dump_json()) - sum(len(f or "") for f in fields) <= ENTRY_CHARS
    assert len(json.dumps({"type": "document", "id": ""})) >= CITATION_CHARS


HOSTILE_ANSWERS = {
    "open brackets": "[",
    "open brackets and letters": "[a",
    "closers": "]",
    "fullwidth runs": "\uff3b\uff3b\uff3d",
    "zero-width runs": "[\u200b\u200b\u200ba",
    "unclosed tags": "[<<<<b",
    "tags": "[<b>a</b>",
}
SIZE = 200_000


def _checking(answer: str, prompt: AssembledPrompt, calls: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(calls):
            check_citations(answer, prompt, max_citations=10**9)
    return run


@pytest.mark.parametrize("name", HOSTILE_ANSWERS)
def test_a_hostile_answer_costs_time_linear_in_its_size(name: str) -> None:
    """Ten times the answer costs about ten times as much: quadratic would be a hundred."""
    prompt = prompt_with(["a"])
    unit = HOSTILE_ANSWERS[name]
    whole = (unit * (SIZE // len(unit) + 1))[:SIZE]
    tenth = whole[: SIZE // 10]

    def ratio() -> float:
        once, ten_times = best_times(_checking(whole, prompt, 1), _checking(tenth, prompt, 10))
        return once / ten_times

    ratios = ratios_until_within(ratio, 3)
    assert min(ratios) < 3, f"{name}: {[f'{r:.1f}x' for r in ratios]} ten tenths"
