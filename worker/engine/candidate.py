"""A chunk with its place in the input, as it travels through the stages."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.models import Chunk, DroppedChunk, DropReason


@dataclass(frozen=True, slots=True)
class Candidate:
    rank: int  # 1-based position in the request's chunk list: the reranker's verdict
    chunk: Chunk

    def drop(
        self,
        reason: DropReason,
        detail: str,
        *,
        duplicate_of: str | None = None,
        similarity: float | None = None,
    ) -> DroppedChunk:
        return DroppedChunk(
            chunk_id=self.chunk.chunk_id,
            doc_id=self.chunk.document,
            rank=self.rank,
            reason=reason,
            detail=detail,
            duplicate_of=duplicate_of,
            similarity=None if similarity is None else round(similarity, 4),
        )
