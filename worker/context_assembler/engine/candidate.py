"""A chunk with its place in the input, as it travels through the stages, and a drop."""

from __future__ import annotations

from typing import Final, NamedTuple

from context_assembler.contract.models import Chunk, DropReason
from context_assembler.engine.facts import TextFacts, known, remember_sketch
from context_assembler.engine.lru import text_key
from context_assembler.engine.model_access import chunk_document, fields_of, tuple_maker
from context_assembler.engine.policy import TitleLineRule
from context_assembler.engine.words import Sketch, chunk_sketch, is_cached, left_out

DETAIL_CHARS: Final = 64  # of an untrusted string quoted in a drop's detail


def brief(value: str) -> str:
    """`value` as a detail quotes it: at most DETAIL_CHARS characters, so a detail costs a
    constant however long the request's audience or a kept chunk's id (one event may drop
    thousands of chunks, each quoting it)."""
    return value if len(value) <= DETAIL_CHARS else f"{value[:DETAIL_CHARS]}…"


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


_new_drop: Final = tuple_maker(Drop)


class Candidate:
    """A chunk and its 1-based position in the request's chunk list: the reranker's verdict.

    Every chunk of an event becomes one, so it is a plain slotted class (a frozen dataclass
    costs twice as much to make); nothing changes one once made but its `facts`. The chunk
    fields every stage reads are read here once (`model_access`): an attribute of a pydantic
    model costs several times a slot, and a large event's chunks are read a dozen times each
    on their way to being dropped.
    """

    __slots__ = (
        "chunk", "chunk_id", "document", "facts", "fields", "rank", "score", "text",
        "text_key", "title",
    )

    def __init__(self, rank: int, chunk: Chunk) -> None:
        self.rank = rank
        self.chunk = chunk
        self.fields = fields = fields_of(chunk)  # every field of the chunk, by name
        self.text: str = fields["text"]
        self.chunk_id: str = fields["chunk_id"]
        self.document = chunk_document(fields)
        self.title: str | None = fields["title"]
        self.score: float | None = fields["score"]
        # 128 bits of the text, hashed once (a 2 KB text costs more to hash than to look
        # up), and what earlier requests learned of it: its costs and word sketch.
        self.text_key = text_key(self.text)
        self.facts: TextFacts = known(self.text_key)

    def __repr__(self) -> str:
        return f"Candidate(rank={self.rank}, chunk_id={self.chunk_id!r})"

    def sketch(self, drop_title_line: TitleLineRule) -> Sketch:
        """`words.chunk_sketch` of the chunk, made once per text and title."""
        title = left_out(self.title, drop_title_line)
        for found in self.facts.sketches:
            if found.title == title:
                return found
        made = chunk_sketch(self.chunk, drop_title_line=drop_title_line)
        if is_cached(self.text, title):  # as its word set is
            self.facts = remember_sketch(self.text_key, made)
        return made

    def drop(
        self,
        reason: DropReason,
        detail: str,
        *,
        duplicate_of: str | None = None,
        similarity: float | None = None,
    ) -> Drop:
        return _new_drop((
            self.chunk_id,
            self.document,
            self.rank,
            reason,
            detail,
            duplicate_of,
            None if similarity is None else round(similarity, 4),
        ))
