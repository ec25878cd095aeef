"""How much evidence survives assembly: answers and gold passages kept at each budget.

A labelled question is an event plus what answers it: `answers` (strings, one of which
should be in the prompt) and/or `gold` (the chunk_id or chunk_ids that hold the answer).
An answer is kept when one of `answers`, normalised as SQuAD normalises answers (lower
case, no punctuation, no articles, single spaces), is a substring of the normalised
`context` of the prompt: string inclusion, the measure "Lost in the Middle" applies to a
model's answer, applied here to what the model is shown. A gold passage is kept when its
chunk is among the prompt's citations; its position is its 1-based place in the context.

The reference is top-k truncation, what frameworks ship: every chunk in rank order as
"title\\ntext", a blank line between, cut at the budget's token.
"""

from __future__ import annotations

import gzip
import re
import string
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from context_assembler.contract.models import RetrievalResult
from context_assembler.diagnose.explain import ChartsUnavailable, printable
from context_assembler.engine import assemble
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.policy import Policy, policy_from_mapping
from context_assembler.engine.tokens import TokenCounter, get_counter

TRUNCATION = "top-k truncation"
_PUNCTUATION = str.maketrans(dict.fromkeys(string.punctuation, " "))
_ARTICLES = re.compile(r"\b(?:a|an|the)\b")


class UnusableRecord(ContextAssemblerError):
    """A line of a labelled file that is not a labelled question."""


def normalise_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles out, one space."""
    lowered = text.lower()
    without = "".join(char for char in lowered if char not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", without).split())


@dataclass(frozen=True, slots=True)
class Labelled:
    """One question of a labelled file: its event and what answers it."""

    event: RetrievalResult
    answers: tuple[str, ...]  # normalised, none empty
    gold: frozenset[str]  # chunk ids


def _labelled(data: Any, origin: str) -> Labelled:
    if not isinstance(data, dict) or "event" not in data:
        raise UnusableRecord(f"{origin}: expected an object with an `event`")
    try:
        event = RetrievalResult.model_validate(data["event"])
    except ValidationError as error:
        raise UnusableRecord(f"{origin}: the event is not a RetrievalResult: {error}") from None
    answers, gold = data.get("answers", []), data.get("gold", [])
    gold = [gold] if isinstance(gold, str) else gold
    for name, value in (("answers", answers), ("gold", gold)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UnusableRecord(f"{origin}: `{name}` must be a list of strings")
    normalised = tuple(dict.fromkeys(filter(None, map(normalise_answer, answers))))
    if not normalised and not gold:
        raise UnusableRecord(f"{origin}: give `answers` or `gold` (chunk ids), or both")
    return Labelled(event, normalised, frozenset(gold))


def read_labelled(path: str | Path) -> list[Labelled]:
    """The labelled questions of a JSONL file (gzip'd when its name ends in .gz)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    with opener(path, "rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            origin = f"{path}:{number}"
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError as error:
                raise UnusableRecord(f"{origin}: not JSON: {error}") from None
            records.append(_labelled(data, origin))
    if not records:
        raise UnusableRecord(f"{path}: no labelled question in it")
    return records


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one prompt kept of one labelled question."""

    answer_kept: bool | None  # None: the question gives no answers
    gold_position: int | None  # 1-based place of the first gold passage shown; None: none
    context_tokens: int
    over_budget: bool


@dataclass(frozen=True, slots=True)
class Score:
    """One policy at one budget over every labelled question."""

    policy: str
    budget: int
    questions: int
    answers_kept: float | None  # share of questions with answers whose answer was kept
    gold_kept: float | None  # share of questions with gold ids whose gold passage was shown
    mean_context_tokens: float
    mean_gold_position: float | None  # over the questions whose gold passage was shown
    over_budget: int  # prompts whose context counted more than the budget
    failed: int  # events the policy could not assemble


def _share(hits: Sequence[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


def summarise(policy: str, budget: int, outcomes: Sequence[Outcome | None]) -> Score:
    """The score of `outcomes` (None: an event the policy could not assemble)."""
    done = [o for o in outcomes if o is not None]
    answered = [o.answer_kept for o in done if o.answer_kept is not None]
    with_gold = [o.gold_position for o in done if o.gold_position != -1]
    positions = [p for p in with_gold if p is not None]
    return Score(
        policy=policy,
        budget=budget,
        questions=len(outcomes),
        answers_kept=_share(answered),
        gold_kept=_share([p is not None for p in with_gold]),
        mean_context_tokens=sum(o.context_tokens for o in done) / len(done) if done else 0.0,
        mean_gold_position=sum(positions) / len(positions) if positions else None,
        over_budget=sum(o.over_budget for o in done),
        failed=len(outcomes) - len(done),
    )


def answer_in(context: str, answers: Iterable[str]) -> bool:
    """Whether one of the (normalised) `answers` is inside the normalised `context`."""
    shown = normalise_answer(context)
    return any(answer in shown for answer in answers)


def at_budget(policy: Policy, budget: int) -> Policy:
    """`policy` with its passage budget replaced by `budget`, every other rule unchanged."""
    return policy_from_mapping({"budget": {"context_tokens": budget}}, base=policy)


def outcome(record: Labelled, policy: Policy, budget: int) -> Outcome | None:
    """What `policy` (already at `budget`) kept of `record`; None if it could not assemble."""
    try:
        prompt = assemble(record.event, policy).prompt
    except ContextAssemblerError:
        return None
    shown = [citation.chunk_id for citation in prompt.citations]
    position: int | None = -1  # no gold ids given
    if record.gold:
        position = next((n for n, cid in enumerate(shown, 1) if cid in record.gold), None)
    return Outcome(
        answer_kept=answer_in(prompt.context, record.answers) if record.answers else None,
        gold_position=position,
        context_tokens=prompt.tokens.context,
        over_budget=prompt.tokens.context > budget,
    )


def truncated(event: RetrievalResult, budget: int, counter: TokenCounter) -> tuple[str, int]:
    """Top-k truncation: every chunk as "title\\ntext" in rank order, a blank line between,
    cut after `budget` tokens; and how many passages it reaches into."""
    parts = [f"{c.title}\n{c.text}" if c.title else c.text for c in event.chunks]
    shown: list[str] = []
    used = 0
    for index, part in enumerate(parts):
        piece = f"\n\n{part}" if index else part
        tokens = counter.count(piece)
        if used + tokens > budget:
            rest = _prefix(piece, budget - used, counter)
            if rest.strip():
                shown.append(rest)
            break
        shown.append(piece)
        used += tokens
    return "".join(shown), len(shown)


def _prefix(text: str, tokens: int, counter: TokenCounter) -> str:
    """The longest start of `text` that counts at most `tokens` (a binary search)."""
    low, high = 0, len(text)
    while low < high:
        middle = (low + high + 1) // 2
        if counter.count(text[:middle]) <= tokens:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def truncation_outcome(record: Labelled, budget: int, counter: TokenCounter) -> Outcome:
    context, reached = truncated(record.event, budget, counter)
    position: int | None = -1
    if record.gold:
        ranks = [n for n, c in enumerate(record.event.chunks[:reached], 1)
                 if c.chunk_id in record.gold]
        position = ranks[0] if ranks else None
    return Outcome(
        answer_kept=answer_in(context, record.answers) if record.answers else None,
        gold_position=position,
        context_tokens=counter.count(context),
        over_budget=False,
    )


def evaluate(
    records: Sequence[Labelled], policies: Sequence[Policy], budgets: Sequence[int]
) -> list[Score]:
    """Per policy, then per budget, the score; the reference (top-k truncation, counted
    with the first policy's tokenizer) first."""
    counter = get_counter(policies[0].tokenizer.encoding if policies else "cl100k_base")
    scores = [
        summarise(TRUNCATION, budget, [truncation_outcome(r, budget, counter) for r in records])
        for budget in budgets
    ]
    for policy in policies:
        for budget in budgets:
            fixed = at_budget(policy, budget)
            scores.append(summarise(policy.name, budget, [outcome(r, fixed, budget)
                                                          for r in records]))
    return scores


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def table(scores: Sequence[Score]) -> str:
    """One line per policy and budget, as `evaluate` prints it."""
    rows = [("policy", "budget", "answer kept", "gold kept", "gold position",
             "context tokens", "over budget", "failed")]
    for score in scores:
        position = "-" if score.mean_gold_position is None else f"{score.mean_gold_position:.1f}"
        rows.append((printable(score.policy), str(score.budget), _percent(score.answers_kept),
                     _percent(score.gold_kept), position, f"{score.mean_context_tokens:.0f}",
                     str(score.over_budget), str(score.failed)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(width) for cell, width in zip(row, widths, strict=True)]
        lines.append("  ".join([row[0].ljust(widths[0]), *cells[1:]]))
    return "\n".join(lines)


def chart(scores: Sequence[Score], path: str) -> None:
    """A PNG: answers kept against the budget, one line per policy (the charts extra)."""
    try:
        import matplotlib
    except ImportError:
        raise ChartsUnavailable(
            "--chart needs matplotlib, the charts extra: from the project's directory, "
            "pip install -e '.[charts]'"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name in dict.fromkeys(score.policy for score in scores):
        points = [(s.budget, 100 * s.answers_kept) for s in scores
                  if s.policy == name and s.answers_kept is not None]
        if points:
            style = "--" if name == TRUNCATION else "-"
            axes.plot(*zip(*points, strict=True), style, marker="o", label=printable(name))
    axes.set_xlabel("passage budget (context tokens)")
    axes.set_ylabel("answers kept (%)")
    axes.set_ylim(0, 100)
    axes.set_title("answers kept in the prompt at each budget")
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, metadata={"Software": None})
    plt.close(figure)


def rows(scores: Sequence[Score]) -> Iterator[dict[str, Any]]:
    """The scores as plain mappings, for JSON."""
    for score in scores:
        yield {field: getattr(score, field) for field in Score.__slots__}
