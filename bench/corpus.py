"""A deterministic corpus for benchmarks: English-like prose, documents, near-duplicates.

Chunks of 250-450 words (by default) from a Zipf-weighted vocabulary of 3,000 words (about
560 tokens and 4.3 bytes per token each), full metadata, scores descending, and about 10 %
near-duplicates (an earlier chunk's body under another document's title). Shared by the
engine and the Kafka benchmarks, so both measure the same events.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Final

from context_assembler.contract.models import Chunk, RetrievalResult

COPY_SHARE: Final = 0.10  # near-duplicates per event
POOL_FACTOR: Final = 3  # warm pool: 3x the event size


# The most frequent ranks are real function words, as in English (about half of all words).
_FUNCTION_WORDS: Final = (
    "the of and to a in is that for it as with be on not this are by or at from you your "
    "can if will an we they which when there all more no must any other may has have been "
    "one should within after before only each than then these their its our out up also "
    "but was were do does how what who where so such into over under two three first new "
    "same every some most very about between both because while per until through"
)
_STEMS: Final = (
    "return refund order item product customer service warrant repair pump filter battery "
    "charge deliver ship account store garden water pressure hose tool part kit model guide "
    "policy procedure claim receipt pay card price stock supply manage staff agent request "
    "contact support invoice label package box season winter summer storage clean check "
    "replace install connect switch motor blade handle cable plug power light sensor valve "
    "nozzle tank seal screw frame wheel cover case panel button display message error code "
    "date period month week day hour minute time rule note detail section version document "
    "form record report review approve confirm cancel change update transfer exchange "
    "credit debit balance cost fee rate limit offer discount member program point reward "
    "gift voucher online email phone visit technician travel address region country local "
    "central standard express safe secure quick direct manual heavy drain freeze heat "
    "temperature surface trigger release spray mower trim hedge lawn soil seed plant"
)
FUNCTION_WORDS: Final = _FUNCTION_WORDS.split()
STEMS: Final = _STEMS.split()
PREFIXES: Final = ("re", "pre", "un", "over", "sub")
SUFFIXES: Final = ("", "s", "ed", "ing", "er", "able", "ment", "ly", "ation", "al")
PRODUCT_CODES: Final = ("PW", "WK", "MT", "KS", "HG", "BL", "TX")
DOC_TYPES: Final = ("policy", "procedure", "help article", "product guide", "supplier content")
VOCABULARY_SIZE: Final = 3000


@dataclass(frozen=True, slots=True)
class Document:
    doc_id: str
    title: str
    doc_type: str
    version: str
    effective_from: date
    source: str


@dataclass(frozen=True, slots=True)
class Passage:
    """A chunk before retrieval scored it: its text is the document title, then the body."""

    chunk_id: str
    document: Document
    section: str
    body: str

    @property
    def text(self) -> str:
        return f"{self.document.title}\n{self.body}"

    def to_chunk(self, score: float) -> Chunk:
        doc = self.document
        return Chunk(
            chunk_id=self.chunk_id,
            text=self.text,
            doc_id=doc.doc_id,
            score=score,
            title=doc.title,
            section=self.section,
            source=doc.source,
            doc_type=doc.doc_type,
            version=doc.version,
            effective_from=doc.effective_from,
        )


class Corpus:
    """Deterministic generator of documents, passages, near-duplicates and questions."""

    def __init__(self, seed: int, passage_words: tuple[int, int] = (250, 450)) -> None:
        """`passage_words`: the least and most words of a passage's prose."""
        self.rng = random.Random(seed)
        self.passage_words = passage_words
        self.vocabulary = self._vocabulary()
        # Zipf-Mandelbrot weights: rank r has weight 1 / (r + 2.7).
        self.cum_weights = list(
            itertools.accumulate(1.0 / (rank + 2.7) for rank in range(len(self.vocabulary)))
        )
        self._ids: set[str] = set()
        self._serial = 0

    def _vocabulary(self) -> list[str]:
        """Function words first, then content words from plain to rare, as in English.

        Frequent words are short and whole tokens; derived forms ("resupplyable") and
        product codes live in the tail. Order is shuffled within each tier.
        """
        seen = set(FUNCTION_WORDS)
        vocabulary = list(FUNCTION_WORDS)
        tiers = (
            [s + x for s in STEMS for x in ("", "s")],
            [s + x for s in STEMS for x in ("ed", "ing", "er")],
            [s + x for s in STEMS for x in SUFFIXES if x not in ("", "s", "ed", "ing", "er")]
            + [f"{prefix}-{self.rng.randrange(100, 9999)}" for prefix in PRODUCT_CODES],
            [p + s + x for p in PREFIXES for s in STEMS for x in SUFFIXES],
        )
        for tier in tiers:
            fresh = [w for w in dict.fromkeys(tier) if w not in seen]
            self.rng.shuffle(fresh)
            seen.update(fresh)
            vocabulary.extend(fresh)
        return vocabulary[:VOCABULARY_SIZE]

    def _chunk_id(self) -> str:
        while True:
            chunk_id = f"{self.rng.getrandbits(48):012x}"
            if chunk_id not in self._ids:
                self._ids.add(chunk_id)
                return chunk_id

    def _words(self, count: int) -> list[str]:
        return self.rng.choices(self.vocabulary, cum_weights=self.cum_weights, k=count)

    def _phrase(self, low: int, high: int) -> str:
        return " ".join(self.rng.choices(STEMS, k=self.rng.randint(low, high))).capitalize()

    def prose(self, count: int) -> str:
        """`count` words as sentences (6-24 words, some commas) in paragraphs."""
        rng, drawn = self.rng, self._words(count)
        paragraphs: list[str] = []
        sentences: list[str] = []
        start = 0
        while start < count:
            end = min(count, start + rng.randint(6, 24))
            sentence = [w + "," if rng.random() < 0.06 else w for w in drawn[start:end - 1]]
            sentence.append(drawn[end - 1])
            text = " ".join(sentence)
            sentences.append(text[0].upper() + text[1:] + ".")
            start = end
            if rng.random() < 0.2:
                paragraphs.append(" ".join(sentences))
                sentences = []
        if sentences:
            paragraphs.append(" ".join(sentences))
        return "\n\n".join(paragraphs)

    def documents(self, count: int) -> list[Document]:
        docs: list[Document] = []
        for _ in range(count):
            self._serial += 1
            doc_type = self.rng.choice(DOC_TYPES)
            name = self._phrase(2, 3)
            slug = "-".join(name.lower().split())
            docs.append(Document(
                doc_id=f"{slug}-{self._serial}",
                title=f"{name} {doc_type} {self._serial}",
                doc_type=doc_type,
                version=str(self.rng.randint(1, 6)),
                effective_from=date(2024, 1, 1) + timedelta(days=self.rng.randrange(900)),
                source=f"kb/{doc_type.replace(' ', '-')}/{slug}-{self._serial}.md",
            ))
        return docs

    def passage(self, documents: Sequence[Document]) -> Passage:
        section = self._phrase(1, 3)
        body = f"{section}\n\n{self.prose(self.rng.randint(*self.passage_words))}"
        return Passage(self._chunk_id(), self.rng.choice(documents), section, body)

    def copy_of(self, original: Passage, documents: Sequence[Document]) -> Passage:
        """The same body under another document's title: a near-duplicate (Jaccard 1.0)."""
        others = [d for d in documents if d.doc_id != original.document.doc_id]
        return Passage(self._chunk_id(), self.rng.choice(others), original.section, original.body)

    def question(self) -> str:
        return " ".join(self._words(self.rng.randint(8, 16))).capitalize() + "?"

    def ranked(
        self, originals: Sequence[Passage], copy: Callable[[Passage], Passage], size: int
    ) -> list[Passage]:
        """`size` passages: the originals, plus copies of some inserted after them.

        The first copy is of the top passage, which always fits the budget, so every event
        drops at least one near-duplicate.
        """
        copies = max(1, round(size * COPY_SHARE))
        ranked = list(originals[: size - copies])
        sources = [0, *self.rng.sample(range(1, len(ranked)), copies - 1)]
        for index in sources:
            original = originals[index]
            after = ranked.index(original) + 1
            ranked.insert(self.rng.randint(after, len(ranked)), copy(original))
        return ranked

    def event(self, request_id: str, passages: Sequence[Passage], question: str) -> RetrievalResult:
        scores = sorted((round(self.rng.uniform(0.05, 0.99), 4) for _ in passages), reverse=True)
        return RetrievalResult(
            request_id=request_id,
            question=question,
            chunks=[p.to_chunk(s) for p, s in zip(passages, scores, strict=True)],
        )

    def warm_events(self, size: int, count: int) -> list[tuple[RetrievalResult, RetrievalResult]]:
        """`count` events of `size` chunks drawn from a pool of POOL_FACTOR x size, each with
        a twin asking another question (run first, it warms the caches as a popular chunk
        set would)."""
        pool_size = POOL_FACTOR * size
        docs = self.documents(max(4, pool_size // 4))
        pool = [self.passage(docs) for _ in range(pool_size)]
        copies = {p.chunk_id: self.copy_of(p, docs) for p in pool}
        events: list[tuple[RetrievalResult, RetrievalResult]] = []
        for i in range(count):
            originals = self.rng.sample(pool, size)
            ranked = self.ranked(originals, lambda p: copies[p.chunk_id], size)
            event = self.event(f"warm-{size}-{i}", ranked, self.question())
            events.append((event, event.model_copy(update={"question": self.question()})))
        return events

    def cold_event(self, size: int, index: int) -> RetrievalResult:
        """An event whose every chunk text is new."""
        docs = self.documents(max(4, size // 4))
        originals = [self.passage(docs) for _ in range(size)]
        ranked = self.ranked(originals, lambda p: self.copy_of(p, docs), size)
        return self.event(f"cold-{size}-{index}", ranked, self.question())
