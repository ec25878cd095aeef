"""Copies: the same chunk twice, identical text, near-duplicate words, similar embeddings.

A chunk is dropped as a copy only of a chunk that is already in the context, as in seed
000: a copy whose better twin did not fit keeps its own chance, and every `duplicate_of`
in the audit points at a passage the model actually saw. Packing walks in rank order by
default, so the best-ranked copy wins.

Two chunks of one document are never merged unless the policy says so: versions 3 and 4
of a returns policy differ in the one number that is the answer. For the same reason, by
default, two chunks are near-duplicates only if they hold the same numbers (`Words.numbers`:
the set of words with a digit, split as for Jaccard): two guides that differ only in "12
months" and "24 months" share 0.926 of their words and both stay. The set, not the multiset,
because Jaccard compares sets: a number said twice in one passage and once in the other is
the same fact, while a number one of them lacks may be the answer. "12" and "12.0" differ
("0" is a word of one only): keeping a true copy costs tokens, dropping the answer costs the
answer. Identical text is a copy whatever it holds; within one document, only of the same
version (or of none): two versions stay apart even with the same text, as seed 000 requires.

Near-duplicates: while few chunks are kept, a candidate is compared with each of them. Against
many, an exact prefix filter (Bayardo et al., "Scaling up all pairs similarity search")
narrows them down: two word sets with Jaccard >= t must share a word among the first
|x| - ceil(t*|x|) + 1 words of each in any fixed order (here: sorted). Against few, each
pair is first put to the two chunks' sketches (`words.Sketch`, kept by `facts`: sizes,
numbers and signatures rule out nearly every pair, exactly), so the word sets, which a
cache holds only a few thousand of, are looked at only for a pair that may be a copy.

Cost, for hostile events too: a candidate's w words are split once and, against more than
SCAN_LIMIT kept chunks, sorted (w log w); it is then compared at most once with each kept
chunk, and a comparison stops within the smaller set, usually after a few misses. Identical
text takes at most two look-ups. The kept chunks are what the budget admits: a passage costs
at least a token per distinct word, so the words one candidate is compared with are about
the budget B at most (with compression, a kept chunk's full word set counts while its extract
pays at least its header, so K kept chunks of up to w words each). An event of n chunks costs
O(n w log w + n min(B, K w)): linear in its size for a given policy. The worst case is chunks
that are all near copies of each other just under the threshold: each is compared in full
with every kept one (tests/engine/test_cost_bounds.py: about 1.3-2.5x benign text).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from context_assembler.contract.models import DropReason
from context_assembler.engine.candidate import Candidate, Drop, brief
from context_assembler.engine.policy import DedupPolicy
from context_assembler.engine.words import (
    Sketch,
    Words,
    chunk_words,
    jaccard,
    jaccard_at_least,
    signature_slack,
)

if TYPE_CHECKING:  # imported where an embedding is compared: most policies never do
    import numpy as np

_EPSILON = 1e-9  # float slack: 0.9 * 10 must count as 9, not 9.000000000000002
SCAN_LIMIT: Final = 32  # up to this many kept chunks, comparing with each is cheapest


@dataclass(frozen=True, slots=True)
class Twin:
    """The kept chunk a candidate copies, and how closely."""

    kept: Candidate
    reason: DropReason
    similarity: float
    measure: str  # "identical text", "jaccard" or "cosine"

    def drop(self, candidate: Candidate) -> Drop:
        if self.reason is DropReason.DUPLICATE:
            detail = f"identical text to {brief(self.kept.chunk_id)} (rank {self.kept.rank})"
        else:
            detail = (
                f"near-duplicate of {brief(self.kept.chunk_id)} (rank {self.kept.rank}), "
                f"{self.measure} {self.similarity:.3f}"
            )
        return candidate.drop(
            self.reason, detail, duplicate_of=self.kept.chunk_id, similarity=self.similarity
        )


def drop_repeated_ids(candidates: list[Candidate]) -> tuple[list[Candidate], list[Drop]]:
    """A chunk_id seen twice is one passage: keep the better-ranked occurrence."""
    first: dict[str, Candidate] = {}
    unique: list[Candidate] = []
    dropped: list[Drop] = []
    for candidate in candidates:
        seen = first.get(candidate.chunk_id)
        if seen is None:
            first[candidate.chunk_id] = candidate
            unique.append(candidate)
        else:
            dropped.append(candidate.drop(
                DropReason.DUPLICATE,
                f"same chunk_id as rank {seen.rank}",
                duplicate_of=candidate.chunk_id,
                similarity=1.0,
            ))
    return unique, dropped


def prefix_length(size: int, threshold: float) -> int:
    return size - math.ceil(threshold * size - _EPSILON) + 1


class CopyDetector:
    """Answers "which kept chunk does this candidate copy?" as the context grows."""

    def __init__(self, policy: DedupPolicy) -> None:
        self._policy = policy
        # text (its text_key) -> document -> the first kept chunk of that document with that
        # text: finding a kept twin of another document takes at most two looks, however
        # many copies.
        self._kept_by_text: dict[int, dict[str, Candidate]] = {}
        # (text_key, document, version) -> the first kept chunk: under `same_document =
        # "copies"`, an exact copy within one document and version is a copy.
        self._kept_copies: dict[tuple[int, str, str | None], Candidate] = {}
        self._kept: list[Candidate] = []  # every kept chunk, when near-duplicates are looked for
        # Of the first SCAN_LIMIT, each with its document (None where documents may merge).
        self._kept_sketches: list[tuple[Candidate, Sketch, str | None]] = []
        self._merge_within_documents = policy.same_document == "dedup"
        self._merge_copies = policy.same_document == "copies"
        self._kept_words: list[tuple[Candidate, Words]] = []  # beyond: full sets, indexed
        self._kept_by_prefix_word: dict[str, list[tuple[Candidate, Words]]] = {}
        self._indexed = 0  # the prefix index holds the first this many of `_kept_words`
        self._kept_vectors: list[tuple[Candidate, np.ndarray]] = []
        # What every scanned comparison reads, read once.
        self._least = policy.near_threshold - _EPSILON
        self._slack = signature_slack(self._least)

    def _may_merge(self, a: Candidate, b: Candidate) -> bool:
        return self._merge_within_documents or a.document != b.document

    def _apart(self, candidate: Candidate) -> str | None:
        """The document whose other chunks `_may_merge` keeps `candidate` apart from, or
        None where documents may merge: what a scanned comparison reads instead."""
        return None if self._merge_within_documents else candidate.document

    def _words(self, candidate: Candidate) -> Words:
        return chunk_words(candidate.chunk, drop_title_line=self._policy.drop_title_line)

    def _sketch(self, candidate: Candidate) -> Sketch:
        return candidate.sketch(self._policy.drop_title_line)

    def _prefix(self, words: frozenset[str]) -> list[str]:
        return sorted(words)[: prefix_length(len(words), self._policy.near_threshold)]

    def find_twin(self, candidate: Candidate) -> Twin | None:
        same_text = self._kept_by_text.get(candidate.text_key)
        if same_text is not None:
            for kept in same_text.values():
                if kept.text == candidate.text and self._may_merge(kept, candidate):
                    return Twin(kept, DropReason.DUPLICATE, 1.0, "identical text")
            copy = self._kept_copies.get(self._copy_key(candidate)) if self._merge_copies else None
            if copy is not None and copy.text == candidate.text:
                return Twin(copy, DropReason.DUPLICATE, 1.0, "identical text")
        best = None  # `_kept` is empty unless near-duplicates are looked for
        if len(self._kept) > SCAN_LIMIT:
            best = self._indexed_twin(candidate)
        elif self._kept:
            best = self._scanned_twin(candidate)
        if best is None and self._kept_vectors:
            best = self._cosine_twin(candidate)
        return best

    def _near_pool(self, words: frozenset[str]) -> Iterable[tuple[Candidate, Words]]:
        """The kept chunks sharing a prefix word with `words` (more than SCAN_LIMIT kept)."""
        for entry in self._kept_words[self._indexed :]:
            for word in self._prefix(entry[1].all):
                self._kept_by_prefix_word.setdefault(word, []).append(entry)
        self._indexed = len(self._kept_words)
        return {
            entry[0].rank: entry
            for word in self._prefix(words)
            for entry in self._kept_by_prefix_word.get(word, ())
        }.values()

    def _indexed_twin(self, candidate: Candidate) -> Twin | None:
        """The best-ranked near twin among more than SCAN_LIMIT kept chunks."""
        for kept in self._kept[len(self._kept_words) :]:  # the prefix index needs full sets
            self._kept_words.append((kept, self._words(kept)))
        found = self._words(candidate)
        words, size = found.all, len(found.all)
        if size == 0:
            return None
        threshold = self._policy.near_threshold
        numbers = found.numbers if self._policy.numbers_must_match else None
        best: Twin | None = None
        for kept, kept_found in self._near_pool(words):
            if best is not None and kept.rank > best.kept.rank:
                continue
            kept_words = kept_found.all
            other = len(kept_words)
            if min(size, other) < threshold * max(size, other) - _EPSILON:
                continue  # sizes alone rule it out
            if not self._may_merge(kept, candidate):
                continue
            if numbers is not None and numbers != kept_found.numbers:
                continue  # a number only one of them holds may be the answer
            similarity = jaccard_at_least(words, kept_words, threshold - _EPSILON)
            if similarity:  # a chunk that shares no word is no copy, even at a threshold of ~0
                best = Twin(kept, DropReason.NEAR_DUPLICATE, similarity, "jaccard")
        return best

    def _scanned_twin(self, candidate: Candidate) -> Twin | None:
        """`_indexed_twin` against a few kept chunks: each in turn, the sketches first, the
        word sets only for a pair the sketches cannot rule out (rarely but for a true copy).
        The tests are those of `_indexed_twin`, cheapest first, signatures among them; every
        chunk of an event comes here, most to be ruled out by signatures alone."""
        sketch = self._sketch(candidate)
        size, signature = sketch.size, sketch.signature
        if size == 0:
            return None
        threshold, least, slack = self._policy.near_threshold, self._least, self._slack
        best: Twin | None = None
        for kept, kept_sketch, kept_document in self._kept_sketches:
            other = kept_sketch.size
            if (signature ^ kept_sketch.signature).bit_count() > (size + other) * slack + 0.5:
                continue  # the signatures rule it out
            if best is not None and kept.rank > best.kept.rank:
                continue
            if min(size, other) < threshold * max(size, other) - _EPSILON:
                continue  # sizes alone rule it out
            if kept_document is not None and kept_document == self._apart(candidate):
                continue  # of one document, and the policy keeps those apart
            if self._policy.numbers_must_match and sketch.numbers != kept_sketch.numbers:
                continue  # a number only one of them holds may be the answer
            # A pair left here is near: counting the shared words in C beats stopping early.
            similarity = jaccard(self._words(candidate).all, self._words(kept).all)
            if similarity and similarity >= least:  # sharing no word is no copy, as above
                best = Twin(kept, DropReason.NEAR_DUPLICATE, similarity, "jaccard")
        return best

    def _vector(self, candidate: Candidate) -> np.ndarray | None:
        embedding = candidate.chunk.embedding
        if self._policy.cosine_threshold is None or not embedding:
            return None
        import numpy as np

        vector = np.asarray(embedding, dtype=np.float64)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else None

    def _cosine_twin(self, candidate: Candidate) -> Twin | None:
        vector = self._vector(candidate)
        if vector is None or self._policy.cosine_threshold is None:
            return None
        import numpy as np
        for kept, kept_vector in sorted(self._kept_vectors, key=lambda item: item[0].rank):
            if kept_vector.shape != vector.shape or not self._may_merge(kept, candidate):
                continue
            similarity = float(np.dot(vector, kept_vector))
            if similarity >= self._policy.cosine_threshold:
                return Twin(kept, DropReason.NEAR_DUPLICATE, similarity, "cosine")
        return None

    @staticmethod
    def _copy_key(candidate: Candidate) -> tuple[int, str, str | None]:
        """Exact copies share it: the same text of the same version (or none) of a document.
        Two versions stay apart even with the same text, as seed 000 requires."""
        return candidate.text_key, candidate.document, candidate.chunk.version

    def add_kept(self, candidate: Candidate) -> None:
        self._kept_by_text.setdefault(candidate.text_key, {}).setdefault(
            candidate.document, candidate
        )
        if self._merge_copies:
            self._kept_copies.setdefault(self._copy_key(candidate), candidate)
        if self._policy.near:
            self._kept.append(candidate)
            if len(self._kept) <= SCAN_LIMIT:
                sketch = self._sketch(candidate)
                self._kept_sketches.append((candidate, sketch, self._apart(candidate)))
        vector = self._vector(candidate)
        if vector is not None:
            self._kept_vectors.append((candidate, vector))
