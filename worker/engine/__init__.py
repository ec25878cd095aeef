"""The assembly engine: pure and synchronous, one small module per stage.

Start at `pipeline.assemble`; each stage module says why it does what it does.
"""

from worker.engine.assemble import Assembly, PromptTooLarge, assemble
from worker.engine.policy import Policy, PolicyError, policy_from_mapping

__all__ = ["Assembly", "Policy", "PolicyError", "PromptTooLarge", "assemble", "policy_from_mapping"]
