"""Select what goes in under the budget.

Walk orders:
- skip: rank order; a passage that does not fit is skipped and the next one tried (seed 000).
- stop: rank order; the first passage that does not fit ends packing (rank fidelity, seed 004).
- density: relevance per token, best first (seed 002's score-per-token variant).
- mmr: maximal marginal relevance, lambda * relevance - (1 - lambda) * redundancy.
In every mode a copy of a kept passage is dropped first, then `max_chunks` and the budget
apply. Relevance is the chunk's score; without scores on every chunk, 1 / rank.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from context_assembler.contract.models import DropReason
from context_assembler.engine.candidate import Candidate, Drop
from context_assembler.engine.dedup import CopyDetector
from context_assembler.engine.policy import CompressPolicy, SelectPolicy, TitleLineRule
from context_assembler.engine.words import chunk_words, jaccard

Cost = Callable[[Candidate, str], int]
Shrink = Callable[[Candidate], str | None]


@dataclass(frozen=True, slots=True)
class Packing:
    """What packing is given besides the candidates: the budget, the rules, and how a
    passage is costed (`cost`) or compressed (`shrink`).

    Each passage after the first is charged `separator_tokens` besides its own cost: with
    the separator's count, the budget covers the joined context; with 0, the passages alone
    (seed 000's sum).
    """

    budget: int
    select: SelectPolicy
    compress: CompressPolicy
    cost: Cost
    shrink: Shrink
    drop_title_line: TitleLineRule = "title"
    separator_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Packed:
    candidate: Candidate
    text: str  # what will be rendered: the chunk's text, or its extract
    tokens: int  # cost as packed (the final label may make it a token smaller)
    compressed: bool
    sentences: tuple[int, int] | None = None  # (kept, of) where focused compression ran
    text_tokens: int | None = None  # the count of " " + text, where focusing knows it


def relevance(candidates: list[Candidate]) -> dict[int, float]:
    scores = [c.score for c in candidates]
    if any(score is None for score in scores):
        return {c.rank: 1.0 / c.rank for c in candidates}
    return {c.rank: float(c.score or 0.0) for c in candidates}


def normalised(values: dict[int, float]) -> dict[int, float]:
    """Into [0, 1]: relative to the best when scores are >= 0, else min-max (logits)."""
    if not values:
        return {}
    low, high = min(values.values()), max(values.values())
    if low >= 0 and high > 0:
        return {rank: value / high for rank, value in values.items()}
    if high == low:
        return dict.fromkeys(values, 1.0)
    return {rank: (value - low) / (high - low) for rank, value in values.items()}


class _Packer:
    """The passages kept so far and what is left of the budget. Every chunk of an event
    passes through `walk` (most of a large one only to be dropped), so what it reads per
    chunk is kept in plain attributes."""

    def __init__(self, packing: Packing, detector: CopyDetector) -> None:
        self.budget = packing.budget
        self.separator_tokens = packing.separator_tokens
        self.max_chunks = packing.select.max_chunks
        self.compress = packing.compress.mode
        self.detector = detector
        self.cost = packing.cost
        self.shrink = packing.shrink
        self.kept: list[Packed] = []
        self.used = 0
        self.left = packing.budget  # what the next passage may cost, its separator paid
        self._left_detail = self._detail_of_left()  # most chunks of a large event need it
        self.full = False  # max_chunks reached
        self.dropped: list[Drop] = []

    def _fit(self, candidate: Candidate) -> Packed | int:
        """The passage as it fits what is left, or else what its whole text costs (the
        drop's detail)."""
        left, whole = self.left, candidate.text
        if self.compress == "always" and (extract := self.shrink(candidate)):
            tokens = self.cost(candidate, extract)
            if tokens <= left:
                return Packed(candidate, extract, tokens, extract != whole)
            return self.cost(candidate, whole)
        tokens = self.cost(candidate, whole)
        if tokens <= left:
            return Packed(candidate, whole, tokens, False)
        if self.compress == "overflow":
            extract = self.shrink(candidate)
            if extract is not None and (extract_tokens := self.cost(candidate, extract)) <= left:
                return Packed(candidate, extract, extract_tokens, True)
        return tokens

    def _detail_of_left(self) -> str:
        return f"{max(0, self.left)} of {self.budget} left"

    def drop_copy(self, candidate: Candidate) -> bool:
        twin = self.detector.find_twin(candidate)
        if twin is not None:
            self.dropped.append(twin.drop(candidate))
        return twin is not None

    def drop_max_chunks(self, candidate: Candidate) -> None:
        self.dropped.append(candidate.drop(
            DropReason.MAX_CHUNKS, f"context already holds max_chunks={self.max_chunks}"
        ))

    def try_keep(self, candidate: Candidate) -> bool:
        packed = self._fit(candidate)
        if isinstance(packed, int):
            self.dropped.append(candidate.drop(
                DropReason.OVER_BUDGET,
                f"needs {packed} tokens, {self._left_detail}",
            ))
            return False
        self.used += packed.tokens + (self.separator_tokens if self.kept else 0)
        self.left = self.budget - self.used - self.separator_tokens
        self._left_detail = self._detail_of_left()
        self.kept.append(packed)
        self.full = self.max_chunks is not None and len(self.kept) >= self.max_chunks
        self.detector.add_kept(candidate)
        return True

    def walk(self, order: list[Candidate], *, stop_at_first_misfit: bool) -> None:
        stopped: Candidate | None = None
        for candidate in order:
            if self.drop_copy(candidate):
                continue
            if stopped is not None:
                self.dropped.append(candidate.drop(
                    DropReason.OVER_BUDGET,
                    f"packing stopped at rank {stopped.rank}, which did not fit",
                ))
            elif self.full:
                self.drop_max_chunks(candidate)
            elif not self.try_keep(candidate) and stop_at_first_misfit:
                stopped = candidate

    def mmr(
        self, candidates: list[Candidate], weight: float, drop_title_line: TitleLineRule
    ) -> None:
        """Greedy MMR with a lazy max-heap: redundancy only grows, so a score popped fresh is
        the true maximum, and each step costs log n instead of a scan of every candidate."""
        relevant = normalised(relevance(candidates))
        words = {
            c.rank: chunk_words(c.chunk, drop_title_line=drop_title_line).all for c in candidates
        }
        redundancy = dict.fromkeys(relevant, 0.0)

        def score(rank: int) -> float:
            return weight * relevant[rank] - (1 - weight) * redundancy[rank]

        remaining = {c.rank: c for c in candidates}
        heap = [(-score(rank), rank) for rank in remaining]  # ties: the better rank first
        heapq.heapify(heap)
        while heap:
            stale, rank = heapq.heappop(heap)
            if -stale != score(rank):
                heapq.heappush(heap, (-score(rank), rank))
                continue
            best = remaining.pop(rank)
            if self.drop_copy(best):
                continue
            if self.full:
                self.drop_max_chunks(best)
                continue
            if self.try_keep(best):
                for other in remaining:
                    similarity = jaccard(words[rank], words[other])
                    redundancy[other] = max(redundancy[other], similarity)


def below_min_score(
    candidates: list[Candidate], policy: SelectPolicy
) -> tuple[list[Candidate], list[Drop]]:
    """The candidates min_score admits, and the drops of the others."""
    eligible: list[Candidate] = []
    dropped: list[Drop] = []
    for candidate in candidates:
        score = candidate.score
        if policy.min_score is not None and (score is None or score < policy.min_score):
            shown = "no score" if score is None else f"score {score:g}"
            dropped.append(candidate.drop(
                DropReason.BELOW_MIN_SCORE, f"{shown} is below min_score {policy.min_score:g}"
            ))
        else:
            eligible.append(candidate)
    return eligible, dropped


def pack(
    candidates: list[Candidate], packing: Packing, detector: CopyDetector
) -> tuple[list[Packed], list[Drop]]:
    """Returns the kept passages in the order they were chosen, and the dropped ones;
    `detector` finds the copies of kept passages."""
    policy, cost = packing.select, packing.cost
    packer = _Packer(packing, detector)
    eligible, packer.dropped = below_min_score(candidates, policy)
    if policy.packing == "mmr":
        packer.mmr(eligible, policy.mmr_lambda, packing.drop_title_line)
    elif policy.packing == "density":
        gain = relevance(eligible)
        if gain and min(gain.values()) < 0:  # logits: per-token division needs gains >= 0
            gain = normalised(gain)
        # Density uses the uncompressed cost: compression is a fallback, not a ranking signal.
        density = {c.rank: gain[c.rank] / max(1, cost(c, c.text)) for c in eligible}
        order = sorted(eligible, key=lambda c: (-density[c.rank], c.rank))
        packer.walk(order, stop_at_first_misfit=False)
    else:
        packer.walk(eligible, stop_at_first_misfit=policy.packing == "stop")
    return packer.kept, packer.dropped
