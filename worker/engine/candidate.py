"""A chunk with its place in the input, as it travels through the stages, and a drop."""

from __future__ import annotations

from typing import NamedTuple

from schemas.models import Chunk, DropReason
from worker.engine.cache import text_key


class Drop(NamedTuple):
    """A dropped chunk, field for field the audit's `DroppedChunk`: most chunks of a large
    event are dropped, and the audit validates them all at once (`assemble._records`), a
    third cheaper than a model each."""

    chunk_id: str
    doc_id: str
    rank: int
    reason: DropReason
    detail: str
    duplicate_of: str | None
    similarity: float | None


class Candidate:
    """A chunk and its 1-based position in the request's chunk list: the reranker's verdict.

    Every chunk of an event becomes one, so it is a plain slotted class (a frozen dataclass
    costs twice as much to make); nothing changes one once made.
    """

    __slots__ = ("chunk", "rank", "text_key")

    def __init__(self, rank: int, chunk: Chunk) -> None:
        self.rank = rank
        self.chunk = chunk
        # 128 bits of the text: the key of its cached costs and word sketch, hashed once
        # instead of once per look-up (a 2 KB text costs more to hash than to look up).
        self.text_key = text_key(chunk.text)

    def __repr__(self) -> str:
        return f"Candidate(rank={self.rank}, chunk_id={self.chunk.chunk_id!r})"

    def drop(
        self,
        reason: DropReason,
        detail: str,
        *,
        duplicate_of: str | None = None,
        similarity: float | None = None,
    ) -> Drop:
        return Drop(
            self.chunk.chunk_id,
            self.chunk.document,
            self.rank,
            reason,
            detail,
            duplicate_of,
            None if similarity is None else round(similarity, 4),
        )
