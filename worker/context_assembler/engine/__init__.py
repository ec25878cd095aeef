"""The assembly engine: deterministic and synchronous, one small module per stage.

Start at `assemble.assemble`; each stage module says why it does what it does. The same
event and policy always give the same bytes; the engine is not pure, though: it keeps what
it learns of popular texts across requests, in the caches `caches` names and bounds.
Nothing here imports from outside the engine but the contract; `errors` holds the
project's error family.

"Seed N" in comments and tests names one of the five source texts on context assembly the
rules were taken from, each reproduced exactly by a preset (intake/presets, checked by
tests/golden and tests/engine/test_seed_presets.py):

- seed 000, the reference assembler (a course lesson's `context.py`: characters / 4 as the
  token estimate, Jaccard 0.9 near-copies, skip what does not fit, search order, the
  ID/title/type/version/dates/section header): `estimated`, its unit tests restated in
  tests/engine/test_seed_000.py; `default` is its rules with a real tokenizer, made safer;
- seed 001, exact copies only and the strongest passages at both edges: `attention-edges`;
- seed 002, the context-window arithmetic and best-first, second-best-last: `window-8k`;
- seed 003, words x 1.3 as the estimate: `word-estimate`;
- seed 004, the answer reserved first, one passage per source a round: `rank-fidelity`.
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
