"""The assembly engine: deterministic and synchronous, one small module per stage.

Start at `assemble.assemble`; each stage module says why it does what it does. The same
event and policy always give the same bytes; the engine is not pure, though: it keeps what
it learns of popular texts across requests, in the caches `caches` names and bounds.
Nothing here imports from outside the engine but the contract; `errors` holds the
project's error family.
"""

from context_assembler.engine.assemble import Assembly, assemble
from context_assembler.engine.errors import (
    ContextAssemblerError,
    InvalidEvent,
    PolicyError,
    PromptTooLarge,
    VocabularyUnavailable,
)
from context_assembler.engine.policy import Policy, policy_from_mapping

__all__ = [
    "Assembly",
    "ContextAssemblerError",
    "InvalidEvent",
    "Policy",
    "PolicyError",
    "PromptTooLarge",
    "VocabularyUnavailable",
    "assemble",
    "policy_from_mapping",
]
