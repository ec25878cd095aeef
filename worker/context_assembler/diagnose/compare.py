"""Compare a replayed assembly with what was published, and say what changed and why.

Pure functions over the two records' bytes: first the rules (policy, engine, tokenizer),
then each chunk whose decision changed with both reasons, then tokens, then the prompt
text as a unified diff. An engine version that differs is named first: outputs of another
engine need not match under the same policy, since the version moves with the decisions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal

from context_assembler.contract.models import AssembledPrompt, AssemblyAudit
from context_assembler.diagnose.explain import printable

Status = Literal["identical", "different", "not published"]
MAX_TEXT_DIFF_LINES = 60


@dataclass
class Comparison:
    request_id: str
    origin: str
    status: Status
    lines: list[str] = field(default_factory=list)

    def render(self) -> str:
        """The comparison as lines for a terminal: request ids, drop details and prompt
        text come from events, so each line is escaped (`printable`)."""
        head = f"{self.request_id} ({self.origin}): {self.status}"
        return "\n".join(printable(line) for line in [head, *(f"  {x}" for x in self.lines)])


def decisions(audit: AssemblyAudit) -> dict[str, str]:
    out = {k.chunk_id: f"kept as [{k.label}]" + (" compressed" if k.compressed else "")
           for k in audit.kept}
    out.update({d.chunk_id: f"dropped: {d.reason.value} ({d.detail})" for d in audit.dropped})
    return out


def _rules(old: AssemblyAudit, new: AssemblyAudit) -> list[str]:
    lines = []
    if old.policy != new.policy:
        lines.append(f"policy: {old.policy.name} {old.policy.hash} -> "
                     f"{new.policy.name} {new.policy.hash}")
    if old.engine != new.engine:
        lines.append(
            f"engine: published by {old.engine.version}, replayed by {new.engine.version}: "
            "the engine's decisions changed between them, so a difference may come from "
            "the code, not the policy")
    if old.tokens.tokenizer != new.tokens.tokenizer:
        lines.append(f"tokenizer: {old.tokens.tokenizer} -> {new.tokens.tokenizer}")
    return lines


def _chunks(old: AssemblyAudit, new: AssemblyAudit) -> list[str]:
    before, after = decisions(old), decisions(new)
    ranks = {k.chunk_id: k.rank for k in new.kept} | {d.chunk_id: d.rank for d in new.dropped}
    changed = [c for c in after if before.get(c) != after[c]]
    return [f"chunk {c} (rank {ranks[c]}): {before.get(c, 'absent')} -> {after[c]}"
            for c in sorted(changed, key=lambda c: ranks[c])]


def _tokens(old: AssemblyAudit, new: AssemblyAudit) -> list[str]:
    parts = [f"{name} {getattr(old.tokens, name)} -> {getattr(new.tokens, name)}"
             for name in ("context", "prompt", "budget")
             if getattr(old.tokens, name) != getattr(new.tokens, name)]
    return ["tokens: " + ", ".join(parts)] if parts else []


def _text(old: AssembledPrompt, new: AssembledPrompt) -> list[str]:
    def text(prompt: AssembledPrompt) -> list[str]:
        return [line for m in prompt.messages for line in [f"[{m.role}]", *m.content.splitlines()]]

    diff = list(
        difflib.unified_diff(text(old), text(new), "published", "replayed", lineterm="", n=1)
    )
    if len(diff) > MAX_TEXT_DIFF_LINES:
        diff = [*diff[:MAX_TEXT_DIFF_LINES], f"... {len(diff) - MAX_TEXT_DIFF_LINES} more lines"]
    return ["prompt text:", *(f"  {line}" for line in diff)] if diff else []


def compare(
    request_id: str,
    origin: str,
    published: tuple[bytes, bytes] | None,
    replayed: tuple[bytes, bytes] | str,
) -> Comparison:
    """`published`: (prompt, audit) bytes; `replayed`: the same, or why it was rejected."""
    if isinstance(replayed, str):
        if published is None:
            return Comparison(request_id, origin, "identical", [f"rejected again: {replayed}"])
        return Comparison(request_id, origin, "different", [f"now rejected: {replayed}"])
    if published is None:
        return Comparison(request_id, origin, "not published",
                          ["no prompt from this input was found on the prompts topic"])
    if published == replayed:
        return Comparison(request_id, origin, "identical")
    old_prompt = AssembledPrompt.model_validate_json(published[0])
    new_prompt = AssembledPrompt.model_validate_json(replayed[0])
    old_audit = AssemblyAudit.model_validate_json(published[1])
    new_audit = AssemblyAudit.model_validate_json(replayed[1])
    rules = _rules(old_audit, new_audit)
    changes = (_chunks(old_audit, new_audit) + _tokens(old_audit, new_audit)
               + _text(old_prompt, new_prompt))
    if rules and not changes:
        changes = ["the same decisions, token figures and prompt text"]
    return Comparison(request_id, origin, "different", rules + changes or ["bytes differ"])
