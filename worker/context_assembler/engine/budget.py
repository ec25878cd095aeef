"""Token budgets: a fixed passage budget, or seed 002's window arithmetic.

Window math reserves the answer first (max_output), keeps a safety margin, subtracts the
fixed prompt (instructions, delimiters, question), then splits what remains between the
conversation history (its share is reserved) and the documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from context_assembler.contract.models import Message
from context_assembler.engine.policy import BudgetPolicy
from context_assembler.engine.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class WindowSplit:
    safe_input: int
    history: int
    docs: int


def split_window(policy: BudgetPolicy, window: int, fixed: int) -> WindowSplit:
    """`window` (the policy's, once checked to be set) split under `policy`'s margins."""
    safe_input = (
        int((window - policy.max_output) * (1 - policy.safety_margin)) - policy.safety_tokens
    )
    remaining = max(0, safe_input - fixed)
    history = int(remaining * policy.history_share)
    return WindowSplit(safe_input, history, remaining - history)


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    passages: int  # what the kept passages may cost together
    prompt_limit: int | None  # hard cap on the whole prompt: window - max_output
    history: tuple[Message, ...]  # the turns that fit, oldest first
    history_dropped: int


def message_tokens(message: Message, counter: TokenCounter, overhead: int) -> int:
    return counter.count(message.content) + overhead


def recent_history(
    turns: Sequence[Message], cap: int, counter: TokenCounter, overhead: int
) -> tuple[Message, ...]:
    """The most recent turns that fit in `cap` tokens (older turns matter least)."""
    kept: list[Message] = []
    used = 0
    for turn in reversed(turns):
        cost = message_tokens(turn, counter, overhead)
        if used + cost > cap:
            break
        kept.append(turn)
        used += cost
    return tuple(reversed(kept))


def plan(
    policy: BudgetPolicy, counter: TokenCounter, fixed: int, history: Sequence[Message]
) -> BudgetPlan:
    """`fixed` is the prompt without passages or history, chat overhead included."""
    if policy.window is None:
        assert policy.context_tokens is not None  # the policy validator guarantees one budget
        return BudgetPlan(policy.context_tokens, None, tuple(history), 0)
    split = split_window(policy, policy.window, fixed)
    kept = recent_history(history, split.history, counter, policy.message_overhead)
    passages = split.docs
    if policy.context_tokens is not None:
        passages = min(passages, policy.context_tokens)
    return BudgetPlan(
        passages, policy.window - policy.max_output, kept, len(history) - len(kept)
    )
