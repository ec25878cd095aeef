"""The engine: one pure, synchronous function from a request and a policy to two records.

guard -> drop repeated ids -> plan the budget -> pack (copies, max_chunks, budget,
compression) -> order -> label and render -> enforce the prompt limit. Every input chunk
ends up exactly once in `kept` or `dropped`; nothing here reads a clock, the environment
or a random source, so the same event and policy give the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from schemas.models import (
    AssembledPrompt,
    AssemblyAudit,
    Citation,
    DroppedChunk,
    DropReason,
    EngineInfo,
    KeptChunk,
    Message,
    PolicyRef,
    RetrievalResult,
    TokenUsage,
)
from worker.engine import budget as budgets
from worker.engine import render
from worker.engine.candidate import Candidate
from worker.engine.compress import extract_relevant
from worker.engine.dedup import CopyDetector, drop_repeated_ids
from worker.engine.guard import guard
from worker.engine.order import arrange
from worker.engine.pack import Packed, pack
from worker.engine.policy import Policy
from worker.engine.tokens import EXACT_TOKENIZERS, TokenCounter, get_counter
from worker.engine.version import __version__

ENGINE = EngineInfo(version=__version__)


class PromptTooLarge(ValueError):
    """Even without passages the prompt exceeds window - max_output: nothing can fix that."""


@dataclass(frozen=True, slots=True)
class Assembly:
    prompt: AssembledPrompt
    audit: AssemblyAudit


def _prompt_tokens(
    history: Sequence[Message], user_parts: list[str], policy: Policy, counter: TokenCounter
) -> int:
    """The exact count of `render.messages`: system prompt, history and the user message,
    counted from its parts (mostly cached), each with the chat overhead."""
    overhead = policy.budget.message_overhead
    earlier = [policy.render.system_prompt, *(turn.content for turn in history)]
    earlier_tokens = sum(counter.count(text) + overhead for text in earlier)
    return earlier_tokens + counter.count_parts(user_parts) + overhead


def _source(item: Packed) -> str:
    chunk = item.candidate.chunk
    return chunk.source or chunk.document


def assemble(event: RetrievalResult, policy: Policy) -> Assembly:
    counter = get_counter(policy.tokenizer.encoding)
    style, scheme = policy.render.header, policy.render.labels

    candidates = [Candidate(rank, chunk) for rank, chunk in enumerate(event.chunks, start=1)]
    passed, dropped = guard(
        candidates, audience=event.audience, as_of=event.as_of, policy=policy.guard
    )
    passed, repeated = drop_repeated_ids(passed)
    dropped += repeated

    bare = render.user_parts(event.question, (), policy.render)  # no passages, no history
    plan = budgets.plan(
        policy.budget, counter, _prompt_tokens((), bare, policy, counter),
        render.neutralise_history(event.history),
    )

    # Numbered labels are issued after ordering; cost each passage with the widest one.
    widest = render.label_for(scheme, max(1, len(passed)), "")
    costs: dict[tuple[int, str], int] = {}

    def cost(candidate: Candidate, text: str) -> int:
        """Packing may ask twice (density, the over-budget detail): render and count once."""
        key = (candidate.rank, text)
        if key not in costs:
            label = candidate.chunk.chunk_id if scheme == "chunk_id" else widest
            costs[key] = counter.count(render.passage(candidate.chunk, text, label, style))
        return costs[key]

    def shrink(candidate: Candidate) -> str | None:
        return extract_relevant(
            candidate.chunk.text, event.question, policy.compress.max_sentences
        )

    separator_tokens = counter.count(policy.render.separator)
    kept, pack_dropped = pack(
        passed,
        budget=plan.passages,
        separator_tokens=separator_tokens,
        policy=policy.select,
        compress=policy.compress,
        detector=CopyDetector(policy.dedup),
        cost=cost,
        shrink=shrink,
        drop_title_line=policy.dedup.drop_title_line,
    )
    dropped += pack_dropped

    exact = counter
    if plan.prompt_limit is not None and counter.name not in EXACT_TOKENIZERS:
        exact = get_counter(policy.tokenizer.exact_encoding)  # an estimate never decides a fit
    history = plan.history
    if plan.prompt_limit is not None:
        history, early = _fit_history(history, bare, plan.prompt_limit, policy, exact)
        history_dropped = plan.history_dropped + early
        kept, shed = _shed_to_fit(
            kept, plan.prompt_limit - _prompt_tokens(history, bare, policy, exact),
            exact, cost_of=lambda item: render.passage(
                item.candidate.chunk, item.text,
                item.candidate.chunk.chunk_id if scheme == "chunk_id" else widest, style),
            separator=policy.render.separator,
        )
        dropped += shed
    else:
        history_dropped = plan.history_dropped

    while True:
        ordered = arrange(sorted(kept, key=lambda p: p.candidate.rank), policy.order.mode, _source)
        labels = [
            render.label_for(scheme, n, item.candidate.chunk.chunk_id)
            for n, item in enumerate(ordered, start=1)
        ]
        passages = [
            render.passage(item.candidate.chunk, item.text, label, style)
            for item, label in zip(ordered, labels, strict=True)
        ]
        user_parts = render.user_parts(event.question, passages, policy.render)
        overflow = _overflow(passages, plan, history, user_parts, policy, counter, exact)
        if overflow is None:
            break
        if not kept:
            raise PromptTooLarge(f"instructions and question alone do not fit: {overflow}")
        # Summed passage counts almost always bound the joined text; if not, shed the
        # passage chosen last until the context and the whole prompt fit.
        last = kept.pop()
        dropped.append(last.candidate.drop(DropReason.OVER_BUDGET, overflow))
    prompt_tokens = _prompt_tokens(history, user_parts, policy, counter)

    messages = render.messages(history, user_parts, policy.render)
    passage_tokens = [counter.count(text) for text in passages]
    policy_ref = PolicyRef(name=policy.name, hash=policy.hash)
    tokens = TokenUsage(
        context=sum(passage_tokens),
        prompt=prompt_tokens,
        budget=plan.passages,
        tokenizer=counter.name,
    )
    abstained = not ordered
    prompt = AssembledPrompt(
        request_id=event.request_id,
        messages=messages,
        context=policy.render.separator.join(passages),
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
            for item, label in zip(ordered, labels, strict=True)
        ],
        tokens=tokens,
        abstained=abstained,
        policy=policy_ref,
        engine=ENGINE,
    )
    audit = AssemblyAudit(
        request_id=event.request_id,
        policy=policy_ref,
        engine=ENGINE,
        kept=[
            KeptChunk(
                chunk_id=item.candidate.chunk.chunk_id,
                doc_id=item.candidate.chunk.document,
                rank=item.candidate.rank,
                label=label,
                tokens=count,
                compressed=item.compressed,
            )
            for item, label, count in zip(ordered, labels, passage_tokens, strict=True)
        ],
        dropped=sorted(dropped, key=_by_rank),
        tokens=tokens,
        abstained=abstained,
        history_turns_dropped=history_dropped,
    )
    return Assembly(prompt, audit)


def _fit_history(
    history: tuple[Message, ...], bare: list[str], limit: int, policy: Policy, exact: TokenCounter
) -> tuple[tuple[Message, ...], int]:
    """Drop the oldest turns while instructions, history and question exceed `limit` by an
    exact count (the plan counted with the policy's tokenizer, which may be an estimate)."""
    overhead = policy.budget.message_overhead
    used = _prompt_tokens((), bare, policy, exact)
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
    cost_of: Callable[[Packed], str],
    separator: str,
) -> tuple[list[Packed], list[DroppedChunk]]:
    """Keep the longest prefix of the chosen passages whose exact counts fit `room`.

    One pass over the passages, so a prompt far over the window (an estimate fooled by
    text it counts badly) costs linear time, not one full recount per shed passage.
    """
    separator_tokens = exact.count(separator)
    used, fits = 0, 0
    for item in kept:
        used += exact.count(cost_of(item)) + (separator_tokens if fits else 0)
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
) -> str | None:
    """Why this rendering does not fit, or None: the joined context must recount within
    the passage budget, and the whole prompt within window - max_output."""
    joined: list[str] = []
    for text in passages:
        joined += [text, policy.render.separator]
    context_tokens = counter.count_parts(joined[:-1])
    if context_tokens > plan.passages:
        return f"the joined context would need {context_tokens} of {plan.passages} tokens"
    if plan.prompt_limit is None:
        return None
    for tokenizer in dict.fromkeys((counter, exact)):  # the reported count, then the exact one
        prompt_tokens = _prompt_tokens(history, user_parts, policy, tokenizer)
        if prompt_tokens > plan.prompt_limit:
            return (
                f"the whole prompt would need {prompt_tokens} tokens ({tokenizer.name}), over "
                f"window - max_output = {plan.prompt_limit}"
            )
    return None


def _by_rank(drop: DroppedChunk) -> int:
    return drop.rank
