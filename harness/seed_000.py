"""Seed 000's passage format and near-duplicate test, as the seed prints them: the naive
baseline `bench.engine_bench` times the engine against, and the oracle the seed-000 preset's
tests compare the engine with."""

from __future__ import annotations

import re

from context_assembler.contract.models import Chunk


def naive_format(chunk: Chunk) -> str:
    """Seed 000's `format_passage`: the header, a newline, the text."""
    dates = f"in force from {chunk.effective_from}" + (
        f" to {chunk.effective_to}" if chunk.effective_to else ", no end date"
    )
    return (
        f"[{chunk.chunk_id}] {chunk.title} | {chunk.doc_type}, version {chunk.version}, "
        f"{dates} | section: {chunk.section or '-'}\n{chunk.text}"
    )


def naive_word_set(text: str) -> set[str]:
    body = text.split("\n", 1)[1] if "\n" in text else text
    return set(re.findall(r"\w+", body.lower()))


def naive_jaccard(a: str, b: str) -> float:
    wa, wb = naive_word_set(a), naive_word_set(b)
    return len(wa & wb) / len(wa | wb) if wa | wb else 1.0
