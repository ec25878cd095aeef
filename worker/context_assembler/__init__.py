"""Context Assembler: which retrieved passages go into a chat prompt, in what order, and why.

As a library::

    import context_assembler as ca

    policy = ca.load_policy("default")            # a preset name, a TOML file, or None
    event = ca.RetrievalResult.model_validate_json(raw)
    result = ca.assemble(event, policy)
    result.prompt.messages, result.audit.dropped
    ca.check_citations(answer_text, result.prompt)  # cited, invented, uncited labels

`assemble` is deterministic: the same event and policy give byte-identical records. The
Kafka worker, the HTTP endpoint and the file mode are shells around it (`context-assembler
--help`). The version is the engine's: every output records it.
"""

from context_assembler.contract.models import (
    AssembledPrompt,
    AssemblyAudit,
    Chunk,
    CitationCheck,
    RetrievalResult,
)
from context_assembler.engine import (
    Assembly,
    ContextAssemblerError,
    InvalidEvent,
    Policy,
    PolicyError,
    PromptTooLarge,
    assemble,
)
from context_assembler.engine.citations import check_citations
from context_assembler.engine.errors import UnreadableAnswer
from context_assembler.engine.version import __version__
from context_assembler.intake.policy_registry import load_policy, preset_names

__all__ = [
    "AssembledPrompt",
    "Assembly",
    "AssemblyAudit",
    "Chunk",
    "CitationCheck",
    "ContextAssemblerError",
    "InvalidEvent",
    "Policy",
    "PolicyError",
    "PromptTooLarge",
    "RetrievalResult",
    "UnreadableAnswer",
    "__version__",
    "assemble",
    "check_citations",
    "load_policy",
    "preset_names",
]
