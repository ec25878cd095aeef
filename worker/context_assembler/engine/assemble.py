"""The engine: one deterministic, synchronous function from a request and a policy to two
records.

`assemble` reads as its steps: candidates -> guard -> drop repeated ids -> plan the budget ->
pack (copies, min_score, max_chunks, budget, compression) -> fit the window -> order, label
and render -> the records. Every input chunk ends up exactly once in `kept` or `dropped`;
nothing here reads a clock, the environment or a random source, so the same event and policy
give the same bytes. What the engine remembers across requests (`caches`) saves work only:
no cached value changes an output.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from context_assembler.contract.models import (
    AssembledPrompt,
    AssemblyAudit,
    Citation,
    DropReason,
    EngineInfo,
    KeptChunk,
    Message,
    PolicyRef,
    RetrievalResult,
    SentencesKept,
    TokenUsage,
)
from context_assembler.engine import render
from context_assembler.engine.assembling import Assembling, block_cost
from context_assembler.engine.candidate import Candidate, Drop
from context_assembler.engine.compress import extract_relevant
from context_assembler.engine.dedup import CopyDetector, drop_repeated_ids
from context_assembler.engine.errors import InvalidEvent, PromptTooLarge, WrongArgument
from context_assembler.engine.focus import FocusPacking, focus
from context_assembler.engine.guard import guard
from context_assembler.engine.order import arrange
from context_assembler.engine.pack import Packed, Packing, below_min_score, pack
from context_assembler.engine.policy import Policy
from context_assembler.engine.tokens import (
    HF_TOKENIZER,
    HuggingFaceCounter,
    TokenCounter,
    get_counter,
)
from context_assembler.engine.version import __version__

ENGINE = EngineInfo(version=__version__)
_PROBLEMS_NAMED: Final = 5  # of an invalid event: enough to fix it, bounded whatever it holds


@dataclass(frozen=True, slots=True)
class Assembly:
    prompt: AssembledPrompt
    audit: AssemblyAudit


def assemble(event: RetrievalResult | Mapping[str, Any], policy: Policy) -> Assembly:
    """The prompt and its audit for `event` (a RetrievalResult, or a mapping such as parsed
    JSON, validated first: InvalidEvent if it is not one) under `policy`; raises
    PromptTooLarge when the instructions and the question alone overflow the window."""
    event = _validated(event)
    _check_types(event, policy)
    counter = get_counter(policy.tokenizer.encoding)
    event = _without_special_tokens(event, policy)
    passed, dropped = guard(
        _candidates(event), audience=event.audience, as_of=event.as_of, policy=policy.guard
    )
    passed, repeated = drop_repeated_ids(passed)
    assembling = Assembling.start(event, policy, counter, passages=len(passed))
    kept, unpacked = _pack(assembling, passed)
    fitted = _fit_window(assembling, kept)
    shown, overflowed = _render_within_limits(assembling, fitted)
    return _records(
        assembling, shown, fitted, [*dropped, *repeated, *unpacked, *fitted.shed, *overflowed]
    )


def _validated(event: RetrievalResult | Mapping[str, Any]) -> RetrievalResult:
    """A caller may hold the event as parsed JSON: validated as the file mode validates it."""
    if not isinstance(event, Mapping):
        return event
    try:
        return RetrievalResult.model_validate(event)
    except ValidationError as error:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'event'}: {e['msg']}"
                    for e in error.errors(include_url=False)[:_PROBLEMS_NAMED]]
        more = error.error_count() - len(problems)
        raise InvalidEvent("not a RetrievalResult: " + "; ".join(problems)
                           + (f"; and {more} more" if more > 0 else "")) from None


def _check_types(event: object, policy: object) -> None:
    """WrongArgument, naming the argument, unless `event` and `policy` are what `assemble`
    takes: callers from untyped code get one of the documented errors."""
    for name, value, kind, wanted in (
        ("event", event, RetrievalResult, "a RetrievalResult or a mapping"),
        ("policy", policy, Policy, "a Policy"),
    ):
        if not isinstance(value, kind):
            raise WrongArgument(f"assemble: {name} must be {wanted}, not {type(value).__name__}")


def _without_special_tokens(event: RetrievalResult, policy: Policy) -> RetrievalResult:
    """What the event says, with no added or special token of the policy's tokenizer.json
    files left as written: the model's server would read one as a control token."""
    for name in dict.fromkeys((policy.tokenizer.encoding, policy.tokenizer.exact_encoding)):
        counter = get_counter(name) if HF_TOKENIZER.fullmatch(name) else None
        if isinstance(counter, HuggingFaceCounter):
            event = counter.specials.event(event)
    return event


def _candidates(event: RetrievalResult) -> list[Candidate]:
    """Every chunk with its 1-based rank: the reranker's verdict travels with the chunk."""
    return [Candidate(rank, chunk) for rank, chunk in enumerate(event.chunks, start=1)]


def _pack(assembling: Assembling, passed: list[Candidate]) -> tuple[list[Packed], list[Drop]]:
    """Choose the passages the budget admits, in packing order: copies of kept passages,
    min_score and max_chunks go first, and compression may make a passage fit."""
    policy, question = assembling.policy, assembling.event.question
    charge_separators = policy.budget.charge_separators
    separator_tokens = (
        assembling.counter.count(policy.render.separator) if charge_separators else 0
    )
    if policy.compress.mode == "focused":
        return _focus(assembling, passed, separator_tokens)

    def shrink(candidate: Candidate) -> str | None:
        return extract_relevant(candidate.text, question, policy.compress.max_sentences)

    packing = Packing(
        budget=assembling.plan.passages,
        select=policy.select,
        compress=policy.compress,
        cost=assembling.passage_costs.charge,
        shrink=shrink,
        drop_title_line=policy.dedup.drop_title_line,
        separator_tokens=separator_tokens,
    )
    return pack(passed, packing, CopyDetector(policy.dedup))


def _focus(
    assembling: Assembling, passed: list[Candidate], separator_tokens: int
) -> tuple[list[Packed], list[Drop]]:
    """Focused compression: the passage budget spent on the event's best sentences;
    min_score still goes first, copies of taken passages and max_chunks still apply."""
    policy = assembling.policy
    eligible, below = below_min_score(passed, policy.select)
    packing = FocusPacking(
        budget=assembling.plan.passages,
        question=assembling.event.question,
        count=assembling.counter.count,
        count_known=assembling.counter.count_known,
        count_rest=assembling.counter.count_rest,
        tokenizer=assembling.counter.name,
        header=lambda candidate: assembling.passage_costs.rendered(candidate, ""),
        cost=assembling.passage_costs.tokens,
        separator_tokens=separator_tokens,
        max_chunks=policy.select.max_chunks,
    )
    focused, dropped = focus(eligible, packing, CopyDetector(policy.dedup))
    kept = [Packed(f.candidate, f.text, f.tokens, f.compressed, f.sentences, f.text_tokens)
            for f in focused]
    return kept, [*below, *dropped]


@dataclass(frozen=True, slots=True)
class _Fitted:
    """The passages and history turns left once the whole prompt fits the window."""

    kept: list[Packed]
    history: tuple[Message, ...]
    history_dropped: int
    shed: list[Drop]


def _fit_window(assembling: Assembling, kept: list[Packed]) -> _Fitted:
    """With a window, the whole prompt must fit by an exact count: the oldest history turns
    go first, then the passages chosen last."""
    plan, exact, costs = assembling.plan, assembling.exact, assembling.passage_costs
    if plan.prompt_limit is None:
        return _Fitted(kept, plan.history, plan.history_dropped, [])
    history, early = _fit_history(assembling, plan.prompt_limit)

    def exact_tokens(item: Packed) -> int:
        """Packing counted each passage already; only an estimate needs a recount."""
        if exact is costs.counter:
            return item.tokens
        tokens = exact.count(costs.rendered(item.candidate, item.text))
        if assembling.policy.render.format == "messages":
            return tokens
        return max(tokens, costs.block_tokens(item.candidate, item.text, exact))

    room = plan.prompt_limit - assembling.prompt_tokens(history, assembling.bare, exact)
    fits, shed = _shed_to_fit(assembling, kept, room, exact_tokens)
    return _Fitted(fits, history, plan.history_dropped + early, shed)


@dataclass(frozen=True, slots=True)
class _Rendered:
    """The kept passages in context order, with their labels and text as the model reads."""

    ordered: list[Packed]
    labels: list[str]
    passages: list[str]
    user_parts: list[str]
    context_tokens: int  # the joined context's count: the budget checks it, the audit shows it
    blocks: list[render.ProviderBlock]  # the passages as the provider format's blocks, if any


def _render(assembling: Assembling, kept: list[Packed]) -> _Rendered:
    """Order the passages where the model reads best, then label them in that order, so
    no numbered label points at a gap."""
    policy = assembling.policy
    ordered = arrange(sorted(kept, key=lambda p: p.candidate.rank), policy.order.mode, _source)
    labels = [
        render.label_for(policy.render.labels, n, item.candidate.chunk_id)
        for n, item in enumerate(ordered, start=1)
    ]
    passages = [
        render.passage(item.candidate.chunk, item.text, label, policy.render.header)
        for item, label in zip(ordered, labels, strict=True)
    ]
    for item, label, text in zip(ordered, labels, passages, strict=True):
        if item.sentences is not None:  # focused: counted from its header and its text's
            # count, which focusing worked out (the label is often new to the text)
            _count_new_passage(assembling.counter, text, render.header(
                item.candidate.chunk, label, policy.render.header), item.text_tokens)
    user_parts = render.user_parts(assembling.event.question, passages, policy.render)
    context_tokens = _context_tokens(passages, policy.render.separator, assembling.counter)
    blocks = [
        block for item, label in zip(ordered, labels, strict=True)
        if (block := render.provider_block(policy.render.format, item.candidate.chunk,
                                           item.text, label, policy.render.header))
    ]
    return _Rendered(ordered, labels, passages, user_parts, context_tokens, blocks)


def _count_new_passage(counter: TokenCounter, passage: str, header: str,
                       text_tokens: int | None) -> None:
    """Count a focused passage as its header and the rest (" " and its text, whose count
    focusing often knows, see `focus`), and remember it: the context and the prompt count
    it whole."""
    counter.remember(passage, counter.count_known([header, passage[len(header):]],
                                                  [None, text_tokens]))


def _render_within_limits(
    assembling: Assembling, fitted: _Fitted
) -> tuple[_Rendered, list[Drop]]:
    """Render, and recount what was rendered: summed passage counts almost always bound the
    joined text; if not, the passage chosen last goes until the context and prompt fit."""
    kept = list(fitted.kept)
    shed: list[Drop] = []
    while True:
        shown = _render(assembling, kept)
        overflow = _overflow(assembling, shown, fitted.history)
        if overflow is None:
            return shown, shed
        if not kept:
            raise PromptTooLarge(f"instructions and question alone do not fit: {overflow}")
        last = kept.pop()
        shed.append(last.candidate.drop(DropReason.OVER_BUDGET, overflow))


def _records(
    assembling: Assembling, shown: _Rendered, fitted: _Fitted, dropped: list[Drop]
) -> Assembly:
    """The prompt for the generation service and the audit of every decision, both from
    the one rendering the model reads."""
    event, policy, counter = assembling.event, assembling.policy, assembling.counter
    tokens = TokenUsage(
        context=shown.context_tokens,
        prompt=assembling.prompt_tokens(fitted.history, shown.user_parts, counter),
        budget=assembling.plan.passages,
        tokenizer=counter.name,
    )
    policy_ref = PolicyRef(name=policy.name, hash=policy.hash)
    abstained = not shown.ordered
    prompt = AssembledPrompt(
        request_id=event.request_id,
        messages=render.messages(fitted.history, shown.user_parts, policy.render),
        context=policy.render.separator.join(shown.passages),
        citations=[
            Citation(
                label=label,
                chunk_id=item.candidate.chunk_id,
                doc_id=item.candidate.document,
                source=item.candidate.chunk.source,
                title=item.candidate.chunk.title,
                section=item.candidate.chunk.section,
                version=item.candidate.chunk.version,
            )
            for item, label in zip(shown.ordered, shown.labels, strict=True)
        ],
        tokens=tokens,
        abstained=abstained,
        policy=policy_ref,
        engine=ENGINE,
        provider_request=render.provider_request(
            fitted.history, shown.blocks, event.question, policy.render
        ),
    )
    # One validation for every drop (read from the Drop tuples' fields), not a model each;
    # strict, since every value already has its field's type (and lax costs a fifth more).
    audit = AssemblyAudit.model_validate(
        {
            "request_id": event.request_id,
            "policy": policy_ref,
            "engine": ENGINE,
            "kept": _kept(shown, counter),
            "dropped": sorted(dropped, key=_by_rank),
            "tokens": tokens,
            "abstained": abstained,
            "history_turns_dropped": fitted.history_dropped,
        },
        from_attributes=True,
        strict=True,
    )
    return Assembly(prompt, audit)


def _kept(shown: _Rendered, counter: TokenCounter) -> list[KeptChunk]:
    """The audit of each passage shown, in context order, with its own token count."""
    return [
        KeptChunk(
            chunk_id=item.candidate.chunk_id,
            doc_id=item.candidate.document,
            rank=item.candidate.rank,
            label=label,
            tokens=counter.count(text),
            compressed=item.compressed,
            sentences=None if item.sentences is None else SentencesKept(
                kept=item.sentences[0], of=item.sentences[1]),
        )
        for item, label, text in zip(shown.ordered, shown.labels, shown.passages, strict=True)
    ]


def _source(item: Packed) -> str:
    chunk = item.candidate.chunk
    return chunk.source or chunk.document


def _fit_history(assembling: Assembling, limit: int) -> tuple[tuple[Message, ...], int]:
    """Drop the oldest turns while instructions, history and question exceed `limit` by an
    exact count (the plan counted with the policy's tokenizer, which may be an estimate)."""
    history, exact = assembling.plan.history, assembling.exact
    overhead = assembling.policy.budget.message_overhead
    used = assembling.prompt_tokens((), assembling.bare, exact)
    costs = [exact.count(turn.content) + overhead for turn in history]
    total = used + sum(costs)
    first = 0
    while first < len(history) and total > limit:
        total -= costs[first]
        first += 1
    return history[first:], first


def _shed_to_fit(
    assembling: Assembling,
    kept: list[Packed],
    room: int,
    exact_tokens: Callable[[Packed], int],
) -> tuple[list[Packed], list[Drop]]:
    """Keep the longest prefix of the chosen passages whose exact counts fit `room`.

    One pass over the passages, so a prompt far over the window (an estimate fooled by
    text it counts badly) costs linear time, not one full recount per shed passage.
    """
    exact = assembling.exact
    separator_tokens = exact.count(assembling.policy.render.separator)
    used, fits = 0, 0
    for item in kept:
        used += exact_tokens(item) + (separator_tokens if fits else 0)
        if used > room:
            break
        fits += 1
    shed = [
        item.candidate.drop(
            DropReason.OVER_BUDGET,
            f"the whole prompt would exceed window - max_output ({exact.name} count)",
        )
        for item in kept[fits:]
    ]
    return kept[:fits], shed


def _overflow(
    assembling: Assembling, shown: _Rendered, history: Sequence[Message]
) -> str | None:
    """Why this rendering does not fit, or None: the joined context (or, where separators
    are not charged, the passages' own counts summed) must recount within the passage
    budget, and the whole prompt within window - max_output."""
    policy, plan, counter = assembling.policy, assembling.plan, assembling.counter
    passages = shown.passages
    if policy.budget.charge_separators:
        if shown.context_tokens > plan.passages:
            return (f"the joined context would need {shown.context_tokens} of {plan.passages} "
                    "tokens")
    elif (passage_tokens := sum(map(counter.count, passages))) > plan.passages:
        return f"the passages would need {passage_tokens} of {plan.passages} tokens"
    overhead = policy.budget.document_overhead
    if shown.blocks and (
        (block_tokens := sum(block_cost(b, counter, overhead) for b in shown.blocks))
        > plan.passages
    ):
        return (f"the {policy.render.format} request's documents would need {block_tokens} "
                f"of {plan.passages} tokens")
    if plan.prompt_limit is None:
        return None
    question = render.question_text(assembling.event.question, len(shown.blocks))
    # The reported count, then the exact one.
    for tokenizer in dict.fromkeys((counter, assembling.exact)):
        prompt_tokens = assembling.prompt_tokens(history, shown.user_parts, tokenizer)
        if shown.blocks:
            charges = [block_cost(block, tokenizer, overhead) for block in shown.blocks]
            prompt_tokens = max(prompt_tokens, assembling.prompt_tokens.provider(
                history, question, charges, tokenizer))
        if prompt_tokens > plan.prompt_limit:
            return (
                f"the whole prompt would need {prompt_tokens} tokens ({tokenizer.name}), over "
                f"window - max_output = {plan.prompt_limit}"
            )
    return None


def _context_tokens(passages: list[str], separator: str, counter: TokenCounter) -> int:
    """The count of the passages joined as the published context, from their parts."""
    joined: list[str] = []
    for text in passages:
        joined += [text, separator]
    return counter.count_parts(joined[:-1])


_by_rank: Final = operator.attrgetter("rank")
