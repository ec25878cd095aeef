"""The engine: one pure, synchronous function from a request and a policy to two records.

guard -> drop repeated ids -> plan the budget -> pack (copies, max_chunks, budget,
compression) -> order -> label and render -> enforce the prompt limit. Every input chunk
ends up exactly once in `kept` or `dropped`; nothing here reads a clock, the environment
or a random source, so the same event and policy give the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
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
from worker import __version__
from worker.engine import budget as budgets
from worker.engine import render
from worker.engine.candidate import Candidate
from worker.engine.compress import extract_relevant
from worker.engine.dedup import CopyDetector, drop_repeated_ids
from worker.engine.guard import guard
from worker.engine.order import arrange
from worker.engine.pack import Packed, pack
from worker.engine.policy import Policy
from worker.engine.tokens import TokenCounter, get_counter

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
        policy.budget, counter, _prompt_tokens((), bare, policy, counter), event.history
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

    kept, pack_dropped = pack(
        passed,
        budget=plan.passages,
        policy=policy.select,
        compress=policy.compress,
        detector=CopyDetector(policy.dedup),
        cost=cost,
        shrink=shrink,
        drop_title_line=policy.dedup.drop_title_line,
    )
    dropped += pack_dropped

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
        prompt_tokens = _prompt_tokens(plan.history, user_parts, policy, counter)
        if plan.prompt_limit is None or prompt_tokens <= plan.prompt_limit:
            break
        if not kept:
            raise PromptTooLarge(
                f"instructions, history and question alone need {prompt_tokens} tokens, over "
                f"window - max_output = {plan.prompt_limit}"
            )
        # Summed passage counts almost always bound the joined text; if not, shed the
        # passage chosen last until the whole prompt fits window - max_output.
        last = kept.pop()
        dropped.append(last.candidate.drop(
            DropReason.OVER_BUDGET,
            f"the whole prompt would exceed window - max_output = {plan.prompt_limit} tokens",
        ))

    messages = render.messages(plan.history, user_parts, policy.render)
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
        history_turns_dropped=plan.history_dropped,
    )
    return Assembly(prompt, audit)


def _by_rank(drop: DroppedChunk) -> int:
    return drop.rank
