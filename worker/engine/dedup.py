"""Copies: the same chunk twice, identical text, near-duplicate words, similar embeddings.

A chunk is dropped as a copy only of a chunk that is already in the context, as in seed
000: a copy whose better twin did not fit keeps its own chance, and every `duplicate_of`
in the audit points at a passage the model actually saw. Packing walks in rank order by
default, so the best-ranked copy wins.

Two chunks of one document are never merged unless the policy says so: versions 3 and 4
of a returns policy differ in the one number that is the answer.

Near-duplicates use an exact prefix-filter join against the kept chunks (Bayardo et al.,
"Scaling up all pairs similarity search"): two word sets with Jaccard >= t must share a
word among the first |x| - ceil(t*|x|) + 1 words of each in any fixed order, so each
candidate is verified against a handful of kept chunks, not all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from schemas.models import DroppedChunk, DropReason
from worker.engine.cache import text_key
from worker.engine.candidate import Candidate
from worker.engine.policy import DedupPolicy
from worker.engine.words import WordProfile, jaccard, word_profile

_EPSILON = 1e-9  # float slack: 0.9 * 10 must count as 9, not 9.000000000000002


@dataclass(frozen=True, slots=True)
class Twin:
    """The kept chunk a candidate copies, and how closely."""

    kept: Candidate
    reason: DropReason
    similarity: float
    measure: str  # "identical text", "jaccard" or "cosine"

    def drop(self, candidate: Candidate) -> DroppedChunk:
        if self.reason is DropReason.DUPLICATE:
            detail = f"identical text to {self.kept.chunk.chunk_id} (rank {self.kept.rank})"
        else:
            detail = (
                f"near-duplicate of {self.kept.chunk.chunk_id} (rank {self.kept.rank}), "
                f"{self.measure} {self.similarity:.3f}"
            )
        return candidate.drop(
            self.reason, detail, duplicate_of=self.kept.chunk.chunk_id, similarity=self.similarity
        )


def drop_repeated_ids(candidates: list[Candidate]) -> tuple[list[Candidate], list[DroppedChunk]]:
    """A chunk_id seen twice is one passage: keep the better-ranked occurrence."""
    first: dict[str, Candidate] = {}
    unique: list[Candidate] = []
    dropped: list[DroppedChunk] = []
    for candidate in candidates:
        seen = first.get(candidate.chunk.chunk_id)
        if seen is None:
            first[candidate.chunk.chunk_id] = candidate
            unique.append(candidate)
        else:
            dropped.append(candidate.drop(
                DropReason.DUPLICATE,
                f"same chunk_id as rank {seen.rank}",
                duplicate_of=candidate.chunk.chunk_id,
                similarity=1.0,
            ))
    return unique, dropped


def prefix_length(size: int, threshold: float) -> int:
    return size - math.ceil(threshold * size - _EPSILON) + 1


class CopyDetector:
    """Answers "which kept chunk does this candidate copy?" as the context grows."""

    def __init__(self, policy: DedupPolicy) -> None:
        self._policy = policy
        self._kept_by_text: dict[int, list[Candidate]] = {}
        self._kept_by_prefix_word: dict[str, list[tuple[Candidate, WordProfile]]] = {}
        self._kept_vectors: list[tuple[Candidate, np.ndarray]] = []

    def _may_merge(self, a: Candidate, b: Candidate) -> bool:
        return self._policy.same_document == "dedup" or a.chunk.document != b.chunk.document

    def _profile(self, candidate: Candidate) -> WordProfile:
        return word_profile(candidate.chunk.text, drop_title_line=self._policy.drop_title_line)

    def _prefix(self, profile: WordProfile) -> tuple[str, ...]:
        size = len(profile.words)
        return profile.ordered[: prefix_length(size, self._policy.near_threshold)]

    def find_twin(self, candidate: Candidate) -> Twin | None:
        for kept in self._kept_by_text.get(text_key(candidate.chunk.text), ()):
            if self._may_merge(kept, candidate):
                return Twin(kept, DropReason.DUPLICATE, 1.0, "identical text")
        best = self._near_twin(candidate)
        if best is None:
            best = self._cosine_twin(candidate)
        return best

    def _near_twin(self, candidate: Candidate) -> Twin | None:
        if not self._policy.near:
            return None
        profile = self._profile(candidate)
        size = len(profile.words)
        if size == 0:
            return None
        threshold = self._policy.near_threshold
        best: Twin | None = None
        checked: set[int] = set()
        for word in self._prefix(profile):
            for kept, kept_profile in self._kept_by_prefix_word.get(word, ()):
                if kept.rank in checked or (best is not None and kept.rank > best.kept.rank):
                    continue
                checked.add(kept.rank)
                other = len(kept_profile.words)
                if min(size, other) < threshold * max(size, other) - _EPSILON:
                    continue  # sizes alone rule it out
                if not self._may_merge(kept, candidate):
                    continue
                similarity = jaccard(profile.words, kept_profile.words)
                if similarity >= threshold - _EPSILON:
                    best = Twin(kept, DropReason.NEAR_DUPLICATE, similarity, "jaccard")
        return best

    def _vector(self, candidate: Candidate) -> np.ndarray | None:
        embedding = candidate.chunk.embedding
        if self._policy.cosine_threshold is None or not embedding:
            return None
        vector = np.asarray(embedding, dtype=np.float64)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm > 0 else None

    def _cosine_twin(self, candidate: Candidate) -> Twin | None:
        vector = self._vector(candidate)
        if vector is None or self._policy.cosine_threshold is None:
            return None
        for kept, kept_vector in sorted(self._kept_vectors, key=lambda item: item[0].rank):
            if kept_vector.shape != vector.shape or not self._may_merge(kept, candidate):
                continue
            similarity = float(np.dot(vector, kept_vector))
            if similarity >= self._policy.cosine_threshold:
                return Twin(kept, DropReason.NEAR_DUPLICATE, similarity, "cosine")
        return None

    def add_kept(self, candidate: Candidate) -> None:
        self._kept_by_text.setdefault(text_key(candidate.chunk.text), []).append(candidate)
        if self._policy.near:
            profile = self._profile(candidate)
            for word in self._prefix(profile):
                self._kept_by_prefix_word.setdefault(word, []).append((candidate, profile))
        vector = self._vector(candidate)
        if vector is not None:
            self._kept_vectors.append((candidate, vector))
