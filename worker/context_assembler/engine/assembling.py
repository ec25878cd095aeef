"""One assembly's state, made once and handed to every stage as one frozen object.

`Assembling` holds what `assemble` works out before it packs: the event and policy, the
tokenizers, the user message without passages, the budget plan, and the two per-assembly
counters (`PromptTokens`, `PassageCosts`) that remember what this request has counted.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from context_assembler.contract.models import Message, RetrievalResult
from context_assembler.engine import budget as budgets
from context_assembler.engine import facts, render
from context_assembler.engine.candidate import Candidate
from context_assembler.engine.lru import text_key
from context_assembler.engine.policy import HeaderStyle, Policy, RenderPolicy
from context_assembler.engine.tokens import EXACT_TOKENIZERS, TokenCounter, get_counter


@dataclass(frozen=True, slots=True)
class Assembling:
    """A request being assembled: what every stage after the guards reads."""

    event: RetrievalResult
    policy: Policy
    counter: TokenCounter  # the policy's tokenizer: budgets and the audit count with it
    exact: TokenCounter  # what decides whether a window fits: an estimate never does
    bare: list[str]  # the user message with no passages, in parts
    plan: budgets.BudgetPlan
    prompt_tokens: PromptTokens
    passage_costs: PassageCosts

    @classmethod
    def start(
        cls, event: RetrievalResult, policy: Policy, counter: TokenCounter, *, passages: int
    ) -> Assembling:
        """Plan the budget from the prompt without passages, for `passages` candidates."""
        bare = render.user_parts(event.question, (), policy.render)  # no passages, no history
        prompt_tokens = PromptTokens(policy)
        plan = budgets.plan(
            policy.budget, counter, prompt_tokens((), bare, counter),
            render.neutralise_history(event.history),
        )
        exact = counter
        if plan.prompt_limit is not None and counter.name not in EXACT_TOKENIZERS:
            exact = get_counter(policy.tokenizer.exact_encoding)
        costs = PassageCosts(policy.render, counter, passages=passages,
                             document_overhead=policy.budget.document_overhead)
        return cls(event, policy, counter, exact, bare, plan, prompt_tokens, costs)


def block_cost(block: render.ProviderBlock, counter: TokenCounter, overhead: int) -> int:
    """A provider block's charge: its text's count plus the stated framing margin."""
    return counter.count(render.block_text(block)) + overhead


class PromptTokens:
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

    def provider(
        self, history: Sequence[Message], question: str, blocks: Sequence[int],
        counter: TokenCounter,
    ) -> int:
        """A provider request's count: system prompt, history and the question text, each
        with the chat overhead, and the blocks' charges (`blocks`)."""
        overhead = self._policy.budget.message_overhead
        texts = (self._policy.render.provider_system_prompt, *(turn.content for turn in history),
                 question)
        return sum(counter.count(text) + overhead for text in texts) + sum(blocks)


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


class PassageCosts:
    """A passage costs the tokens of its rendered form; numbered labels are issued only after
    ordering, so it is rendered with the widest label it may get. A popular chunk is rendered
    and counted once per (tokenizer, label, header fields) across requests (`facts`)."""

    def __init__(
        self, policy: RenderPolicy, counter: TokenCounter, *, passages: int,
        document_overhead: int,
    ) -> None:
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
        self._form = policy.format
        self._document_overhead = document_overhead
        self._blocks: dict[tuple[str, int, str], int] = {}  # by (tokenizer, rank, text)

    def charge(self, candidate: Candidate, text: str) -> int:
        """What packing charges `text` as `candidate`'s passage: in a provider format, the
        larger of its cost in `messages` and as the provider's block, so both fit."""
        tokens = self.tokens(candidate, text)
        if self._form == "messages":
            return tokens
        return max(tokens, self.block_tokens(candidate, text, self.counter))

    def block_tokens(self, candidate: Candidate, text: str, counter: TokenCounter) -> int:
        """`text` as `candidate`'s block in the provider format, framing margin included."""
        memo = (counter.name, candidate.rank, text)
        tokens = self._blocks.get(memo)
        if tokens is None:
            block = render.provider_block(
                self._form, candidate.chunk, text,
                self._shared_label or candidate.chunk_id, self._style,
            )
            assert block is not None  # only asked in a provider format
            tokens = self._blocks[memo] = block_cost(block, counter, self._document_overhead)
        return tokens

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
