"""The engine: one pure, synchronous function from a request and a policy to two records.

`assemble` reads as its steps: candidates -> guard -> drop repeated ids -> plan the budget ->
pack (copies, min_score, max_chunks, budget, compression) -> fit the window -> order, label
and render -> the records. Every input chunk ends up exactly once in `kept` or `dropped`;
nothing here reads a clock, the environment or a random source, so the same event and policy
give the same bytes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

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
    TokenUsage,
)
from context_assembler.engine import budget as budgets
from context_assembler.engine import facts, render
from context_assembler.engine.cache import text_key
from context_assembler.engine.candidate import Candidate, Drop
from context_assembler.engine.compress import extract_relevant
from context_assembler.engine.dedup import CopyDetector, drop_repeated_ids
from context_assembler.engine.errors import PromptTooLarge
from context_assembler.engine.guard import guard
from context_assembler.engine.order import arrange
from context_assembler.engine.pack import Packed, pack
from context_assembler.engine.policy import HeaderStyle, Policy, RenderPolicy
from context_assembler.engine.tokens import (
    EXACT_TOKENIZERS,
    HF_TOKENIZER,
    HuggingFaceCounter,
    TokenCounter,
    get_counter,
)
from context_assembler.engine.version import __version__

ENGINE = EngineInfo(version=__version__)


@dataclass(frozen=True, slots=True)
class Assembly:
    prompt: AssembledPrompt
    audit: AssemblyAudit


def assemble(event: RetrievalResult, policy: Policy) -> Assembly:
    """The prompt and its audit for `event` under `policy`; raises PromptTooLarge when the
    instructions and the question alone overflow the window."""
    counter = get_counter(policy.tokenizer.encoding)
    event = _without_special_tokens(event, policy)
    candidates = _candidates(event)
    passed, dropped = guard(
        candidates, audience=event.audience, as_of=event.as_of, policy=policy.guard
    )
    passed, repeated = drop_repeated_ids(passed)
    bare = render.user_parts(event.question, (), policy.render)  # no passages, no history
    counts = _PromptTokens(policy)
    plan = _plan_budget(event, policy, counter, bare, counts)
    costs = _PassageCosts(policy.render, counter, passages=len(passed))
    kept, unpacked = _pack(event, policy, passed, plan.passages, counter, costs)
    exact = _exact_counter(policy, plan, counter)
    fitted = _fit_window(kept, plan, bare, policy, exact, costs, counts)
    shown, overflowed = _render_within_limits(event, policy, plan, fitted, counter, exact, counts)
    return _records(
        event, policy, counter, plan, shown, fitted,
        [*dropped, *repeated, *unpacked, *fitted.shed, *overflowed], counts,
    )


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


def _plan_budget(
    event: RetrievalResult,
    policy: Policy,
    counter: TokenCounter,
    bare: list[str],
    counts: _PromptTokens,
) -> budgets.BudgetPlan:
    """What passages may cost and which history turns fit, from the prompt without them."""
    return budgets.plan(
        policy.budget, counter, counts((), bare, counter),
        render.neutralise_history(event.history),
    )


# What `render.header` reads of a chunk, per style (the chunk_id for `chunk.document` too),
# from the chunk's fields by name (`Candidate.fields`): every chunk of an event is costed.
_HEADER_FIELDS: Final[dict[HeaderStyle, Callable[[dict[str, Any]], facts.Fields]]] = {
    "full": operator.itemgetter(
        "chunk_id", "doc_id", "title", "doc_type", "version", "effective_from",
        "effective_to", "section",
    ),
    "source_section": operator.itemgetter("chunk_id", "doc_id", "source", "section"),
    "inline_section": operator.itemgetter("chunk_id", "section"),
    "id_score": lambda fields: (fields["chunk_id"], _score_shown(fields["score"])),
}


def _score_shown(score: float | None) -> str | None:
    """The score as the header prints it: -0.0 equals 0.0 but prints "-0.00"."""
    return None if score is None else f"{score:.2f}"


class _PassageCosts:
    """A passage costs the tokens of its rendered form; numbered labels are issued only after
    ordering, so it is rendered with the widest label it may get. A popular chunk is rendered
    and counted once per (tokenizer, label, header fields) across requests (`facts`)."""

    def __init__(self, policy: RenderPolicy, counter: TokenCounter, *, passages: int) -> None:
        self.counter = counter
        self._style: HeaderStyle = policy.header
        self._fields = _HEADER_FIELDS[policy.header]
        # The label every passage is costed with, or None where each has its chunk_id.
        self._shared_label = (
            None if policy.labels == "chunk_id"
            else render.label_for(policy.labels, max(1, passages), "")
        )
        self._rendering: facts.Rendering = (counter.name, policy.header, self._shared_label)
        # By (rank, extract): an extract is a text of its own, hashed once per request.
        self._extracts: dict[tuple[int, str], int] = {}

    def rendered(self, candidate: Candidate, text: str) -> str:
        """`text` as the passage of `candidate`, header and (widest) label included."""
        return render.passage(
            candidate.chunk, text, self._shared_label or candidate.chunk_id, self._style
        )

    def tokens(self, candidate: Candidate, text: str) -> int:
        """What `text` costs as the passage of `candidate`. Every chunk of an event is
        costed, most only to be dropped, so this is one call; packing may ask twice."""
        fields = self._fields(candidate.fields)
        if text is candidate.text:
            tokens = facts.passage_cost(candidate.facts, self._rendering, fields)
            if tokens is None:
                tokens, candidate.facts = self._count(candidate, text, candidate.text_key, fields)
            return tokens
        memo = (candidate.rank, text)
        tokens = self._extracts.get(memo)
        if tokens is None:
            key = text_key(text)
            tokens = facts.passage_cost(facts.known(key), self._rendering, fields)
            if tokens is None:
                tokens, _ = self._count(candidate, text, key, fields)
            self._extracts[memo] = tokens
        return tokens

    def _count(
        self, candidate: Candidate, text: str, key: int, fields: facts.Fields
    ) -> tuple[int, facts.TextFacts]:
        """Render and count what no request has costed yet; the text's facts from now on."""
        tokens = self.counter.count(self.rendered(candidate, text))
        return tokens, facts.remember_cost(key, self._rendering, fields, tokens)


def _pack(
    event: RetrievalResult,
    policy: Policy,
    passed: list[Candidate],
    budget: int,
    counter: TokenCounter,
    costs: _PassageCosts,
) -> tuple[list[Packed], list[Drop]]:
    """Choose the passages the budget admits, in packing order: copies of kept passages,
    min_score and max_chunks go first, and compression may make a passage fit."""

    def shrink(candidate: Candidate) -> str | None:
        return extract_relevant(
            candidate.text, event.question, policy.compress.max_sentences
        )

    return pack(
        passed,
        budget=budget,
        separator_tokens=(
            counter.count(policy.render.separator) if policy.budget.charge_separators else 0
        ),
        policy=policy.select,
        compress=policy.compress,
        detector=CopyDetector(policy.dedup),
        cost=costs.tokens,
        shrink=shrink,
        drop_title_line=policy.dedup.drop_title_line,
    )


def _exact_counter(
    policy: Policy, plan: budgets.BudgetPlan, counter: TokenCounter
) -> TokenCounter:
    """The tokenizer that decides what fits a window: an estimate never does."""
    if plan.prompt_limit is not None and counter.name not in EXACT_TOKENIZERS:
        return get_counter(policy.tokenizer.exact_encoding)
    return counter


@dataclass(frozen=True, slots=True)
class _Fitted:
    """The passages and history turns left once the whole prompt fits the window."""

    kept: list[Packed]
    history: tuple[Message, ...]
    history_dropped: int
    shed: list[Drop]


def _fit_window(
    kept: list[Packed],
    plan: budgets.BudgetPlan,
    bare: list[str],
    policy: Policy,
    exact: TokenCounter,
    costs: _PassageCosts,
    counts: _PromptTokens,
) -> _Fitted:
    """With a window, the whole prompt must fit by an exact count: the oldest history turns
    go first, then the passages chosen last."""
    if plan.prompt_limit is None:
        return _Fitted(kept, plan.history, plan.history_dropped, [])
    history, early = _fit_history(plan.history, bare, plan.prompt_limit, policy, exact, counts)

    def exact_tokens(item: Packed) -> int:
        """Packing counted each passage already; only an estimate needs a recount."""
        if exact is costs.counter:
            return item.tokens
        return exact.count(costs.rendered(item.candidate, item.text))

    fits, shed = _shed_to_fit(
        kept, plan.prompt_limit - counts(history, bare, exact), exact,
        exact_tokens, separator=policy.render.separator,
    )
    return _Fitted(fits, history, plan.history_dropped + early, shed)


@dataclass(frozen=True, slots=True)
class _Rendered:
    """The kept passages in context order, with their labels and text as the model reads."""

    ordered: list[Packed]
    labels: list[str]
    passages: list[str]
    user_parts: list[str]


def _render(event: RetrievalResult, policy: Policy, kept: list[Packed]) -> _Rendered:
    """Order the passages where the model reads best, then label them in that order, so
    no numbered label points at a gap."""
    ordered = arrange(sorted(kept, key=lambda p: p.candidate.rank), policy.order.mode, _source)
    labels = [
        render.label_for(policy.render.labels, n, item.candidate.chunk_id)
        for n, item in enumerate(ordered, start=1)
    ]
    passages = [
        render.passage(item.candidate.chunk, item.text, label, policy.render.header)
        for item, label in zip(ordered, labels, strict=True)
    ]
    return _Rendered(
        ordered, labels, passages, render.user_parts(event.question, passages, policy.render)
    )


def _render_within_limits(
    event: RetrievalResult,
    policy: Policy,
    plan: budgets.BudgetPlan,
    fitted: _Fitted,
    counter: TokenCounter,
    exact: TokenCounter,
    counts: _PromptTokens,
) -> tuple[_Rendered, list[Drop]]:
    """Render, and recount what was rendered: summed passage counts almost always bound the
    joined text; if not, the passage chosen last goes until the context and prompt fit."""
    kept = list(fitted.kept)
    shed: list[Drop] = []
    while True:
        shown = _render(event, policy, kept)
        overflow = _overflow(
            shown.passages, plan, fitted.history, shown.user_parts, policy, counter, exact, counts
        )
        if overflow is None:
            return shown, shed
        if not kept:
            raise PromptTooLarge(f"instructions and question alone do not fit: {overflow}")
        last = kept.pop()
        shed.append(last.candidate.drop(DropReason.OVER_BUDGET, overflow))


def _records(
    event: RetrievalResult,
    policy: Policy,
    counter: TokenCounter,
    plan: budgets.BudgetPlan,
    shown: _Rendered,
    fitted: _Fitted,
    dropped: list[Drop],
    counts: _PromptTokens,
) -> Assembly:
    """The prompt for the generation service and the audit of every decision, both from
    the one rendering the model reads."""
    prompt_tokens = counts(fitted.history, shown.user_parts, counter)
    messages = render.messages(fitted.history, shown.user_parts, policy.render)
    passage_tokens = [counter.count(text) for text in shown.passages]
    policy_ref = PolicyRef(name=policy.name, hash=policy.hash)
    tokens = TokenUsage(
        context=_context_tokens(shown.passages, policy.render.separator, counter),
        prompt=prompt_tokens,
        budget=plan.passages,
        tokenizer=counter.name,
    )
    abstained = not shown.ordered
    prompt = AssembledPrompt(
        request_id=event.request_id,
        messages=messages,
        context=policy.render.separator.join(shown.passages),
        citations=[
            Citation(
                label=label,
                chunk_id=item.candidate.chunk.chunk_id,
                doc_id=item.candidate.chunk.document,
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
    )
    # One validation for every drop (read from the Drop tuples' fields), not a model each;
    # strict, since every value already has its field's type (and lax costs a fifth more).
    audit = AssemblyAudit.model_validate(
        {
            "request_id": event.request_id,
            "policy": policy_ref,
            "engine": ENGINE,
            "kept": [
                KeptChunk(
                    chunk_id=item.candidate.chunk.chunk_id,
                    doc_id=item.candidate.chunk.document,
                    rank=item.candidate.rank,
                    label=label,
                    tokens=count,
                    compressed=item.compressed,
                )
                for item, label, count in zip(
                    shown.ordered, shown.labels, passage_tokens, strict=True
                )
            ],
            "dropped": sorted(dropped, key=_by_rank),
            "tokens": tokens,
            "abstained": abstained,
            "history_turns_dropped": fitted.history_dropped,
        },
        from_attributes=True,
        strict=True,
    )
    return Assembly(prompt, audit)


class _PromptTokens:
    """The exact count of `render.messages`: system prompt, history and the user message,
    counted from its parts (mostly cached), each with the chat overhead.

    Once per (tokenizer, history, user message) in an assembly: the prompt without
    passages is asked for up to three times, the final one twice.
    """

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._found: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}

    def __call__(
        self, history: Sequence[Message], user_parts: list[str], counter: TokenCounter
    ) -> int:
        contents = tuple(turn.content for turn in history)
        key = (counter.name, contents, tuple(user_parts))
        tokens = self._found.get(key)
        if tokens is None:
            overhead = self._policy.budget.message_overhead
            earlier = (self._policy.render.system_prompt, *contents)
            earlier_tokens = sum(counter.count(text) + overhead for text in earlier)
            tokens = earlier_tokens + counter.count_parts(user_parts) + overhead
            self._found[key] = tokens
        return tokens


def _source(item: Packed) -> str:
    chunk = item.candidate.chunk
    return chunk.source or chunk.document


def _fit_history(
    history: tuple[Message, ...],
    bare: list[str],
    limit: int,
    policy: Policy,
    exact: TokenCounter,
    counts: _PromptTokens,
) -> tuple[tuple[Message, ...], int]:
    """Drop the oldest turns while instructions, history and question exceed `limit` by an
    exact count (the plan counted with the policy's tokenizer, which may be an estimate)."""
    overhead = policy.budget.message_overhead
    used = counts((), bare, exact)
    costs = [exact.count(turn.content) + overhead for turn in history]
    total = used + sum(costs)
    first = 0
    while first < len(history) and total > limit:
        total -= costs[first]
        first += 1
    return history[first:], first


def _shed_to_fit(
    kept: list[Packed],
    room: int,
    exact: TokenCounter,
    exact_tokens: Callable[[Packed], int],
    separator: str,
) -> tuple[list[Packed], list[Drop]]:
    """Keep the longest prefix of the chosen passages whose exact counts fit `room`.

    One pass over the passages, so a prompt far over the window (an estimate fooled by
    text it counts badly) costs linear time, not one full recount per shed passage.
    """
    separator_tokens = exact.count(separator)
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
    passages: list[str],
    plan: budgets.BudgetPlan,
    history: Sequence[Message],
    user_parts: list[str],
    policy: Policy,
    counter: TokenCounter,
    exact: TokenCounter,
    counts: _PromptTokens,
) -> str | None:
    """Why this rendering does not fit, or None: the joined context (or, where separators
    are not charged, the passages' own counts summed) must recount within the passage
    budget, and the whole prompt within window - max_output."""
    if policy.budget.charge_separators:
        context_tokens = _context_tokens(passages, policy.render.separator, counter)
        if context_tokens > plan.passages:
            return f"the joined context would need {context_tokens} of {plan.passages} tokens"
    elif (passage_tokens := sum(map(counter.count, passages))) > plan.passages:
        return f"the passages would need {passage_tokens} of {plan.passages} tokens"
    if plan.prompt_limit is None:
        return None
    for tokenizer in dict.fromkeys((counter, exact)):  # the reported count, then the exact one
        prompt_tokens = counts(history, user_parts, tokenizer)
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
