"""The embedded default: the engine over JSONL files, no broker.

One input line in gives one prompt line and one audit line out, in input order. A line
that cannot be assembled becomes an error record with its origin (file:line) and the
reason, and the next line is processed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from worker.codec import Limits, RejectedInput, decode_event, encode
from worker.engine import Assembly, PromptTooLarge, assemble
from worker.policies import PolicyRegistry


def assemble_bytes(
    raw: bytes, registry: PolicyRegistry, limits: Limits
) -> Assembly:
    """Decode, pick the policy and assemble; every failure is a RejectedInput."""
    event = decode_event(raw, limits)
    policy = registry.resolve(event.policy, event.request_id)
    try:
        return assemble(event, policy)
    except PromptTooLarge as error:
        raise RejectedInput("budget", str(error), event.request_id) from error
    except Exception as error:  # an engine bug must cost one event, not the stream
        raise RejectedInput(
            "engine", f"{type(error).__name__}: {error}", event.request_id
        ) from error


@dataclass
class Totals:
    assembled: int = 0
    rejected: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


def run(
    sources: Iterable[tuple[str, BinaryIO]],
    registry: PolicyRegistry,
    limits: Limits,
    *,
    prompts: BinaryIO,
    audits: BinaryIO | None,
    errors: BinaryIO,
) -> Totals:
    totals = Totals()
    for name, stream in sources:
        for number, line in enumerate(stream, start=1):
            raw = line.rstrip(b"\r\n")
            if not raw.strip():
                continue
            try:
                assembly = assemble_bytes(raw, registry, limits)
            except RejectedInput as rejected:
                errors.write(encode(rejected.record(f"{name}:{number}", raw)) + b"\n")
                totals.rejected += 1
                totals.reasons[rejected.reason] = totals.reasons.get(rejected.reason, 0) + 1
                continue
            prompts.write(encode(assembly.prompt) + b"\n")
            if audits is not None:
                audits.write(encode(assembly.audit) + b"\n")
            totals.assembled += 1
    return totals
