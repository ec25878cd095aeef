"""The one way in from bytes: an input becomes an Assembly, or a RejectedInput saying why.

Every shell (the file mode, the Kafka worker, replay) hands its raw input here, so the same
bytes get the same outputs, or the same rejection, in each. The engine's errors about one
event become its rejection, with the event's request_id: a policy the request may not name
(`policy`), instructions and question that alone overflow the window (`budget`), an id
that spells a special token of the policy's tokenizer (`schema`), and any
other exception, a bug, which must cost one event and not the stream (`engine`).
"""

from __future__ import annotations

from context_assembler.contract.models import RejectReason, RetrievalResult
from context_assembler.engine import Assembly, Policy, assemble
from context_assembler.engine.errors import PolicyError, PromptTooLarge, SpecialTokenInId
from context_assembler.intake.codec import Check, Excerpt, Limits, RejectedInput, decode_event
from context_assembler.intake.policy_registry import PolicyRegistry


def assemble_bytes(
    raw: bytes | Excerpt, registry: PolicyRegistry, limits: Limits, check: Check | None = None
) -> Assembly:
    """Decode (checked by `check` too, if given), pick the policy and assemble; every
    failure is a RejectedInput."""
    event = decode_event(raw, limits, check)
    policy = resolve_policy(registry, event)
    try:
        return assemble(event, policy)
    except PromptTooLarge as error:
        raise RejectedInput(RejectReason.BUDGET, str(error), event.request_id) from error
    except SpecialTokenInId as error:
        raise RejectedInput(RejectReason.SCHEMA, str(error), event.request_id) from error
    except Exception as error:  # an engine bug must cost one event, not the stream
        raise RejectedInput(
            RejectReason.ENGINE, f"{type(error).__name__}: {error}", event.request_id
        ) from error


def resolve_policy(registry: PolicyRegistry, event: RetrievalResult) -> Policy:
    """The policy `event` names, or a RejectedInput (`policy`) if it may not name it."""
    try:
        return registry.resolve(event.policy)
    except PolicyError as error:
        raise RejectedInput(RejectReason.POLICY, str(error), event.request_id) from error
