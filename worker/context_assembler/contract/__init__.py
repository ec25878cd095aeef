"""The contract with the other services: one pydantic model per topic record.

`schemas/*.schema.json` and `schemas/asyncapi.yaml` are generated from these models
(`python -m context_assembler.generate.schemas`); a test fails when they drift.
"""

from context_assembler.contract.models import (
    SCHEMA_VERSION,
    AssembledPrompt,
    AssemblyAudit,
    Chunk,
    Citation,
    DroppedChunk,
    DropReason,
    EngineInfo,
    ErrorRecord,
    KeptChunk,
    Message,
    PolicyRef,
    RejectReason,
    RetrievalResult,
    SentencesKept,
    TokenUsage,
)

__all__ = [
    "SCHEMA_VERSION",
    "AssembledPrompt",
    "AssemblyAudit",
    "Chunk",
    "Citation",
    "DropReason",
    "DroppedChunk",
    "EngineInfo",
    "ErrorRecord",
    "KeptChunk",
    "Message",
    "PolicyRef",
    "RejectReason",
    "RetrievalResult",
    "SentencesKept",
    "TokenUsage",
]
