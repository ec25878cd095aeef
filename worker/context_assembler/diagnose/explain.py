"""Readable views of the engine's decisions: one request's table, and a budget sweep.

What they show comes from events, which are untrusted: control characters are escaped so
that a chunk id cannot move the cursor, recolour or rewrite the operator's terminal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from context_assembler.contract.models import AssemblyAudit, Chunk, RetrievalResult
from context_assembler.engine import assemble, render
from context_assembler.engine.errors import ContextAssemblerError
from context_assembler.engine.policy import Policy, policy_from_mapping
from context_assembler.engine.tokens import get_counter

# C0 and C1 controls (ESC and CSI start ANSI sequences), bidi controls, line separators.
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` with each control character written as its escape (\\x1b, \\u202e)."""
    return _UNSAFE.sub(lambda match: ascii(match.group())[1:-1], text)


class UnusableInput(ContextAssemblerError):
    """An input the command cannot show: an audit of another version of the event, say."""


class ChartsUnavailable(ContextAssemblerError):
    """A chart was asked for without the charts extra installed."""


def passage_tokens(chunk: Chunk, policy: Policy, passages: int) -> int:
    """What the chunk would cost uncompressed, labelled as the policy labels passages (a
    numbered label: the widest of the event's `passages`, as the engine costs it)."""
    counter = get_counter(policy.tokenizer.encoding)
    label = render.label_for(policy.render.labels, max(1, passages), chunk.chunk_id)
    return counter.count(render.passage(chunk, chunk.text, label, policy.render.header))


def decision_table(event: RetrievalResult, audit: AssemblyAudit, policy: Policy) -> str:
    """Rank, chunk, document, tokens, and kept with its label or dropped with its reason."""
    kept = {k.rank: k for k in audit.kept}
    dropped = {d.rank: d for d in audit.dropped}
    if kept.keys() | dropped.keys() != set(range(1, len(event.chunks) + 1)):
        raise UnusableInput(
            f"the audit of {audit.request_id!r} does not decide exactly the "
            f"{len(event.chunks)} chunks of its event: not the same input"
        )
    rows = [("rank", "chunk", "document", "tokens", "decision")]
    for rank, chunk in enumerate(event.chunks, start=1):
        if rank in kept:
            item = kept[rank]
            tokens = str(item.tokens)
            decision = f"kept as [{item.label}]" + (" (compressed)" if item.compressed else "")
        else:
            drop = dropped[rank]
            tokens = str(passage_tokens(chunk, policy, len(event.chunks)))
            decision = f"dropped: {drop.reason.value}: {drop.detail}"
        rows.append((str(rank), printable(chunk.chunk_id), printable(chunk.document), tokens,
                     printable(decision)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [printable(
        f"request {audit.request_id} | policy {audit.policy.name} ({audit.policy.hash}) | "
        f"tokenizer {audit.tokens.tokenizer} | budget {audit.tokens.budget} | "
        f"context {audit.tokens.context} tokens | prompt {audit.tokens.prompt} tokens"
        + (" | ABSTAINED: nothing usable" if audit.abstained else "")
    )]
    for row in rows:
        cells = [row[0].rjust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2]),
                 row[3].rjust(widths[3]), row[4]]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


SEED_BUDGETS = [*range(100, 1001, 50), 1500]  # seed 000's explorer slider


@dataclass(frozen=True)
class SweepPoint:
    budget: int
    kept: list[str]  # chunk_ids in context order
    tokens: int  # what the budget was charged: the joined context, or the passages alone


def sweep(event: RetrievalResult, policy: Policy, budgets: list[int]) -> list[SweepPoint]:
    """What fits at each passage budget, everything else about the policy unchanged."""
    points = []
    for amount in budgets:
        fixed = policy_from_mapping(
            {"budget": {"context_tokens": amount, "window": None}}, base=policy
        )
        audit = assemble(event, fixed).audit
        charged = (audit.tokens.context if policy.budget.charge_separators
                   else sum(k.tokens for k in audit.kept))
        points.append(SweepPoint(amount, [k.chunk_id for k in audit.kept], charged))
    return points


def sweep_table(event: RetrievalResult, points: list[SweepPoint], policy: Policy) -> str:
    lines = [f"request {printable(event.request_id)}: passages in the prompt at each budget "
             f"under policy {printable(policy.name)} ({policy.hash})",
             "budget  passages  tokens  kept"]
    for point in points:
        lines.append(
            f"{point.budget:>6}  {len(point.kept):>4} of {len(event.chunks):<2} {point.tokens:>6}  "
            + " ".join(map(printable, point.kept))
        )
    return "\n".join(lines)


def sweep_chart(
    event: RetrievalResult, points: list[SweepPoint], policy: Policy, path: str
) -> None:
    """A PNG: tokens used (bars) against the budget (line), passages kept on each bar.
    matplotlib is an extra (charts) so that the worker image goes without it."""
    try:
        import matplotlib
    except ImportError:
        raise ChartsUnavailable(
            "--png needs matplotlib, the charts extra: from the project's directory, "
            "pip install -e '.[charts]'"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 4.5), dpi=100)
    labels = [str(p.budget) for p in points]
    axes.bar(labels, [p.tokens for p in points], color="#3b6ea8", label="tokens used")
    axes.plot(labels, [p.budget for p in points], color="#c44e52", marker="o", label="budget")
    for index, point in enumerate(points):
        axes.annotate(str(len(point.kept)), (index, point.tokens), ha="center",
                      va="bottom", fontsize=8)
    axes.set_xlabel("passage budget (tokens)")
    axes.set_ylabel("tokens")
    axes.set_title(f"{printable(event.request_id)} under policy {printable(policy.name)} "
                   f"({policy.hash}): what fits at each budget (number = passages kept)",
                   fontsize=10)
    axes.legend(loc="upper left")
    plt.setp(axes.get_xticklabels(), rotation=45)
    figure.tight_layout()
    figure.savefig(path, metadata={"Software": None})
    plt.close(figure)
