"""The assembly engine: pure and synchronous, one small module per stage.

Start at `assemble.assemble`; each stage module says why it does what it does. Nothing here
imports from outside the engine but the contract; `errors` holds the project's error family.
"""

from context_assembler.engine.assemble import Assembly, assemble
from context_assembler.engine.errors import (
    ContextAssemblerError,
    PolicyError,
    PromptTooLarge,
    VocabularyUnavailable,
)
from context_assembler.engine.policy import Policy, policy_from_mapping

__all__ = [
    "Assembly",
    "ContextAssemblerError",
    "Policy",
    "PolicyError",
    "PromptTooLarge",
    "VocabularyUnavailable",
    "assemble",
    "policy_from_mapping",
]
