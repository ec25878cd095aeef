"""Every token figure an output reports equals a recount of what it describes (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from context_assembler.contract.models import Chunk, KeptChunk, RetrievalResult
from context_assembler.engine import assemble, render
from context_assembler.engine.compress import extract_relevant
from context_assembler.engine.policy import Policy
from context_assembler.engine.tokens import get_counter
from tests.engine.test_properties import SETTINGS, assemble_unless_too_large, events, policies
from tests.factories import chunk, event, policy


def check_every_figure(event: RetrievalResult, policy: Policy) -> None:
    result = assemble_unless_too_large(event, policy)
    if result is None:
        return
    prompt, audit = result.prompt, result.audit
    counter = get_counter(policy.tokenizer.encoding)
    assert prompt.tokens == audit.tokens

    # Each kept passage, rendered as the model reads it: the context is exactly these,
    # joined by the separator, and each one's figure is its own recount.
    chunks = {k.rank: event.chunks[k.rank - 1] for k in audit.kept}
    passages = []
    for number, kept in enumerate(audit.kept):
        source = chunks[kept.rank]
        text = source.text
        if kept.compressed and policy.compress.mode == "focused":
            text = _focused_extract(prompt.context, audit.kept[number:], chunks, policy)
        elif kept.compressed:
            extract = extract_relevant(text, event.question, policy.compress.max_sentences)
            assert extract is not None
            text = extract
        passages.append(render.passage(source, text, kept.label, policy.render.header))
        assert kept.tokens == counter.count(passages[-1]), kept.chunk_id
    assert prompt.context == policy.render.separator.join(passages)

    # The context figure is the published context recounted, separators included.
    assert audit.tokens.context == counter.count(prompt.context)
    # The prompt figure is every message recounted, each with its chat overhead.
    overhead = policy.budget.message_overhead
    assert audit.tokens.prompt == sum(counter.count(m.content) + overhead for m in prompt.messages)


def _focused_extract(context: str, rest: list[KeptChunk], chunks: dict[int, Chunk],
                     policy: Policy) -> str:
    """The extract focusing chose for `rest[0]`, read off the context: between its header
    and the next passage's (headers cannot occur in passage text: they are neutralised).
    Its sentences are checked verbatim and in order elsewhere (test_focus.py)."""
    style, separator = policy.render.header, policy.render.separator
    joiner = " " if style == "inline_section" else "\n"
    first = render.header(chunks[rest[0].rank], rest[0].label, style) + joiner
    start = context.index(first) + len(first)
    if len(rest) == 1:
        return context[start:]
    following = separator + render.header(chunks[rest[1].rank], rest[1].label, style)
    return context[start:context.index(following, start)]


@SETTINGS
@given(events(), policies())
def test_every_token_figure_is_a_recount_of_what_it_describes(
    event: RetrievalResult, policy: Policy
) -> None:
    check_every_figure(event, policy)


@SETTINGS
@given(st.lists(st.sampled_from(["pump.", "hose", "kit:", "warranty", "a", "\n", "é"]),
                min_size=1, max_size=30).map(" ".join),
       st.integers(2, 12), st.sampled_from(["\n\n", "\n---\n", "\n"]),
       st.sampled_from(["cl100k_base", "chars/4", "words*1.3"]))
def test_the_context_figure_counts_the_separators(
    text: str, passages: int, separator: str, encoding: str
) -> None:
    """Many short passages, so the separators weigh: under chars/4, "\\n\\n" between 12
    passages is 6 tokens the passages' own counts leave out."""
    chunks = [chunk(f"c{n}", f"{text} {n}", doc_id=f"d{n}") for n in range(passages)]
    chosen = policy(tokenizer={"encoding": encoding}, render={"separator": separator},
                    budget={"context_tokens": 100_000}, dedup={"near": False})
    check_every_figure(event(chunks), chosen)


def test_the_figure_of_a_context_of_short_passages_is_not_their_sum() -> None:
    """The figure the audit gave before: the passages' own counts, separators left out."""
    chunks = [chunk(f"c{n}", f"Pump kit {n}.", doc_id=f"d{n}") for n in range(8)]
    result = assemble(event(chunks), policy(tokenizer={"encoding": "chars/4"}))
    passages_alone = sum(k.tokens for k in result.audit.kept)
    assert result.audit.tokens.context == get_counter("chars/4").count(result.prompt.context)
    assert result.audit.tokens.context > passages_alone
