"""Hostile input: time and memory are bounded by the size of the event.

Every field of an event is untrusted, so `assemble` must cost about what benign text of the
same size costs, whatever the text holds. Events here have the shapes of the codec's limits
(`context_assembler.intake.codec.Limits`: 100,000-character chunks, 2,000 chunks, 4 MiB) at a fortieth of the
size: 10 chunks of 10,000 characters, or 50 chunks of 2,000. A pass quadratic in a run of
characters (a regex that backtracks) shows as a ratio far above the bound even at this
scale. Times are only ever compared with each other (best of 3, each run on new texts so no
cache helps), never with a clock budget.
"""

from __future__ import annotations

import gc
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from context_assembler.contract.models import RetrievalResult
from context_assembler.engine import assemble, caches, facts, sentences, words
from context_assembler.engine.lru import COUNT_ENTRY_BYTES, BoundedCache, SizedCache, text_key
from context_assembler.engine.policy import Policy, policy_from_mapping
from context_assembler.engine.tokens import get_counter
from context_assembler.intake.policy_registry import load_preset
from tests.factories import chunk
from tests.support.cpu_ratios import ratios_until_within

MAX_RATIO = 20.0  # hostile text may cost this many times benign text of the same size
RUNS = 3


@dataclass(frozen=True, slots=True)
class Shape:
    chunks: int
    chars: int


BIG = Shape(10, 10_000)  # few chunks at the longest a chunk may be
MANY = Shape(50, 2_000)  # the most chunks an event may hold, of ordinary length

Text = Callable[[random.Random, int], str]  # (seeded rng, characters) -> text of that length

VOCABULARY = (
    "the a of to and in is it you that was for on are with as they be at one have this from "
    "or by word but what some we can out other were all there when up use your how said an "
    "each which do their time if will way about many then them would like so these long make "
    "see two has look more day could go come did number no most people over know water than "
    "call first who may down side now find pump hose warranty years months delivery receipt "
    "refund policy frost garage kit trigger seal motor spray"
).split()


def repeat(unit: str, size: int) -> str:
    return (unit * (size // len(unit) + 1))[:size]


def tag(rng: random.Random) -> str:
    """A word of its own per text, so texts differ and no cache is hit."""
    return f"w{rng.randrange(10**9):09d} "


def _sentences(rng: random.Random, size: int) -> str:
    out: list[str] = []
    length = 0
    while length < size:
        sentence = [rng.choice(VOCABULARY) for _ in range(rng.randint(6, 18))]
        if rng.random() < 0.3:  # now and then a number, as in real passages
            sentence[rng.randrange(len(sentence))] = str(rng.randint(1, 999))
        out.append(" ".join(sentence).capitalize() + ". ")
        length += len(out[-1])
    return "".join(out)


_PROSE = _sentences(random.Random(0), 300_000)  # generated once: texts are slices of it
_NUMBERS = " ".join(str(n) for n in random.Random(0).choices(range(10**9), k=30_000))


def slice_of(pool: str, rng: random.Random, size: int) -> str:
    start = rng.randrange(len(pool) - size)
    return (tag(rng) + pool[start : start + size])[:size]


def prose(rng: random.Random, size: int) -> str:
    """Benign text: English-like sentences."""
    return slice_of(_PROSE, rng, size)


CORE = ["a" + "".join("bcdefghijk"[int(d)] for d in f"{j:04d}") for j in range(250)]


def near_copy(rng: random.Random, size: int) -> str:
    """Shared words that sort first (so every prefix-filter lookup finds every kept chunk)
    and 7 % words of its own, without digits: Jaccard about 0.86, just under 0.9, so every
    chunk is kept and compared in full with every kept one."""
    core = CORE[: size // 8]
    own = -(-len(core) * 7 // 100)
    body = core + ["".join(rng.choice("lmnopqrstuvwxyz") for _ in range(8)) for _ in range(own)]
    rng.shuffle(body)
    return repeat(" ".join(body) + " ", size)


@dataclass(frozen=True, slots=True)
class Case:
    shape: Shape
    text: Text
    same_text: bool = False  # one text (new per run) for every chunk of the event
    same_document: bool = False
    title_line: bool = True  # "Guide {i}" first, as the chunk's title


HOSTILE: dict[str, Case] = {
    "whitespace runs": Case(BIG, lambda r, n: repeat(tag(r) + " " * 3000 + "\t" * 500 + "x.\n" + "\n" * 500, n)),
    "'<' then blanks": Case(BIG, lambda r, n: repeat(tag(r) + "<" + " " * 300, n)),
    "bracket runs": Case(BIG, lambda r, n: repeat(tag(r) + "<" * 1000 + "[" * 1000 + "\n[", n)),
    "repeated delimiters": Case(BIG, lambda r, n: repeat(tag(r) + "</documents>\n[S1] <documents> < / documents >\n", n)),
    "one huge word": Case(BIG, lambda r, n: (tag(r) + "a" * n)[:n]),
    "no spaces": Case(BIG, lambda r, n: repeat(f"abc{r.randrange(100)}.def,ghi;jkl!mno?", n)),
    "no words at all": Case(BIG, lambda r, n: repeat(".,;:!?-" * r.randint(1, 9) + " ", n), title_line=False),
    "no words, non-ascii": Case(BIG, lambda r, n: repeat("—…“”„« » · " * r.randint(1, 9), n), title_line=False),
    "many numbers": Case(MANY, lambda r, n: slice_of(_NUMBERS, r, n)),
    "tiny sentences": Case(BIG, lambda r, n: tag(r) + repeat("a. b! c? ", n - 11)),
    "one line per character": Case(BIG, lambda r, n: tag(r) + repeat("x\n", n - 11)),
    "non-ascii": Case(BIG, lambda r, n: repeat(tag(r) + "Zusammenarbeit über Landesgrenzen 中文字符 кириллица ", n)),
    "near-identical chunks": Case(MANY, near_copy),
    "copies under other titles": Case(MANY, prose, same_text=True),
    "identical chunks, one document": Case(MANY, prose, same_text=True, same_document=True),
}


def make_event(case: Case, seed: int) -> RetrievalResult:
    def text(i: int) -> str:
        return case.text(random.Random(seed * 100_003 + (0 if case.same_text else i)), case.shape.chars)

    chunks = [
        chunk(f"c{i}", f"Guide {i}\n" + text(i) if case.title_line else text(i), title=f"Guide {i}",
              doc_id="d" if case.same_document else f"d{i}")
        for i in range(case.shape.chunks)
    ]
    return RetrievalResult(request_id="r", question="How long is the pump warranty?", chunks=chunks)


def run_time(event: RetrievalResult, policy: Policy) -> float:
    """CPU time of this thread: other processes on the machine count little."""
    gc.collect()
    start = time.thread_time()
    assemble(event, policy)
    return time.thread_time() - start


POLICIES: dict[str, Callable[[], Policy]] = {
    "default": Policy,
    "estimated": lambda: load_preset("estimated"),  # chars/4: no tokenizer hides other costs
    "focused": lambda: load_preset("focused"),  # every chunk's word forms read
    # A 200K window: every chunk fits, so dedup compares each with every kept one; MMR and
    # compression of every passage on top.
    "wide, mmr, compress": lambda: policy_from_mapping({
        "tokenizer": {"encoding": "chars/4"},
        "budget": {"context_tokens": 100_000, "window": 200_000},
        "select": {"packing": "mmr"},
        "compress": {"mode": "always"},
    }),
}


def cost_ratio(policy: Policy, case: Case) -> float:
    """Hostile time over benign time, each the fastest of RUNS runs on new texts, the two
    kinds alternating so that the machine's load falls on both alike."""
    benign = Case(case.shape, prose)
    assemble(make_event(benign, seed=-1), policy)  # load the tokenizer
    fastest = {"benign": float("inf"), "hostile": float("inf")}
    for run in range(RUNS):
        fastest["benign"] = min(fastest["benign"],
                                run_time(make_event(benign, seed=1000 + run), policy))
        fastest["hostile"] = min(fastest["hostile"], run_time(make_event(case, seed=run), policy))
    return fastest["hostile"] / fastest["benign"]


@pytest.mark.parametrize(("policy_name", "case"), [
    (policy_name, case) for policy_name in POLICIES for case in HOSTILE
])
def test_hostile_text_costs_about_what_benign_text_of_its_size_costs(policy_name: str, case: str) -> None:
    policy = POLICIES[policy_name]()
    ratios = ratios_until_within(lambda: cost_ratio(policy, HOSTILE[case]), MAX_RATIO)
    assert min(ratios) < MAX_RATIO, f"{case}: {[f'{r:.1f}x' for r in ratios]} benign"


# --------------------------------------------------------------------------------------
# Caches: bounded in bytes, whatever streams through them
# --------------------------------------------------------------------------------------


def test_word_sets_of_long_texts_are_not_cached() -> None:
    long_text = chunk("big", "x " * words.WORD_CACHE_MAX_CHARS)
    before = len(words.CACHE)
    assert words.chunk_words(long_text, drop_title_line="title").all == {"x"}
    assert len(words.CACHE) == before


@pytest.fixture
def configure_caches() -> Iterator[Callable[..., None]]:
    """`caches.configure`, from empty caches; the default caps come back afterwards."""
    defaults = {name: c.max_bytes for name, c in caches.CACHES.items() if c.max_bytes is not None}
    caches.reset()
    yield caches.configure
    caches.configure(**defaults)


def test_a_stream_of_events_leaves_every_cache_under_its_cap(
    configure_caches: Callable[..., None],
) -> None:
    """What 776 MB of RSS was made of: word sets of 40 x 99 KB chunks, event after event.

    The caps are small here so that the stream overflows them; the accounting is what is
    checked (bench/memory_bench.py measures the process at full size).
    """
    configure_caches(words=256 * 1024, facts=64 * 1024, tokens=300 * COUNT_ENTRY_BYTES)
    word_cache, facts_cache = words.CACHE, facts.FACTS
    count_cache = get_counter("cl100k_base").cache  # type: ignore[attr-defined]
    assert count_cache.max_entries == 300
    rng = random.Random(5)
    for _ in range(3):  # long chunks: none may be cached
        long = [chunk(f"c{i}", prose(rng, 20_000), doc_id=f"d{i}") for i in range(4)]
        assemble(RetrievalResult(request_id="r", question="pump?", chunks=long), Policy())
    assert len(word_cache) == 0
    assert not any(entry.sketches for entry in facts_cache._entries.values())
    for _ in range(3):  # then many short chunks, each cached, more than the caps hold
        short = [chunk(f"c{i}", prose(rng, 1_000), doc_id=f"d{i}") for i in range(200)]
        assemble(RetrievalResult(request_id="r", question="pump?", chunks=short), Policy())
    for sized in (word_cache, facts_cache):
        assert sized.nbytes == sum(e.nbytes for e in sized._entries.values()) <= sized.max_bytes
    assert count_cache.nbytes == len(count_cache) * COUNT_ENTRY_BYTES <= count_cache.max_bytes
    for cache in (word_cache, facts_cache, count_cache):  # full, and evicting: the cap binds
        assert cache.nbytes > cache.max_bytes * 0.9
    assert all(len(text) <= words.WORD_CACHE_MAX_CHARS for text, _ in word_cache._entries)


def test_word_forms_remembered_for_focusing_are_charged_and_bounded(
    configure_caches: Callable[..., None],
) -> None:
    """Focusing weighs every passage by the word forms of its text, remembered with the
    text's facts: charged for their string, never of a text over 4 KB, under the cap."""
    configure_caches(facts=64 * 1024)
    facts_cache, policy = facts.FACTS, load_preset("focused")
    rng = random.Random(11)
    long = [chunk(f"c{i}", prose(rng, 20_000), doc_id=f"d{i}") for i in range(4)]
    assemble(RetrievalResult(request_id="r", question="pump?", chunks=long), policy)
    assert not any(entry.terms for entry in facts_cache._entries.values())
    for _ in range(3):
        short = [chunk(f"c{i}", prose(rng, 1_000), doc_id=f"d{i}") for i in range(100)]
        assemble(RetrievalResult(request_id="r", question="pump?", chunks=short), policy)
    entries = list(facts_cache._entries.values())
    assert facts_cache.nbytes == sum(e.nbytes for e in entries) <= facts_cache.max_bytes
    assert facts_cache.nbytes > facts_cache.max_bytes * 0.9  # full, and evicting
    remembered = [e for e in entries if e.terms is not None]
    assert remembered
    assert all(e.nbytes >= sys.getsizeof(e.terms) for e in remembered)


def test_passage_costs_are_charged_for_their_header_fields(
    configure_caches: Callable[..., None],
) -> None:
    """Passage costs are kept across requests, keyed by header fields the producer chose:
    long titles must cost their bytes, and the cap must bind."""
    configure_caches(facts=64 * 1024)
    costs = facts.FACTS
    rng = random.Random(6)
    for n in range(3):
        chunks = [
            chunk(f"c{n}-{i}", prose(rng, 200), title="t" * 5_000 + str(i), section="s" * 3_000)
            for i in range(20)
        ]
        assemble(RetrievalResult(request_id="r", question="pump?", chunks=chunks), Policy())
    assert costs.nbytes == sum(v.nbytes for v in costs._entries.values()) <= costs.max_bytes
    assert all(v.costs and v.nbytes > 8_000 for v in costs._entries.values())
    assert costs.nbytes > costs.max_bytes * 0.8  # full, and evicting


def test_one_text_keeps_a_bounded_number_of_answers_each_charged() -> None:
    """One text under ever new header fields (hostile, or one paragraph in many documents)
    keeps its newest MAX_VARIANTS costs, and its entry is charged for what it holds."""
    body = prose(random.Random(9), 300)
    for i in range(3 * facts.MAX_VARIANTS):
        event = RetrievalResult(
            request_id="r", question="pump?",
            chunks=[chunk(f"c{i}", body, doc_id=f"d{i}", title=f"Guide {i}" + "x" * 500)],
        )
        assemble(event, Policy())
    entry = facts.known(text_key(body))
    assert len(entry.costs) == len(entry.sketches) == facts.MAX_VARIANTS
    newest = 3 * facts.MAX_VARIANTS - 1
    assert entry.costs[0].fields[0] == f"c{newest}"
    assert entry.sketches[0].title == f"Guide {newest}" + "x" * 500
    assert entry.nbytes == facts._ENTRY_BYTES + sum(
        part.nbytes for part in (*entry.costs, *entry.sketches)
    )
    assert all(cost.nbytes > 500 for cost in entry.costs)  # the long title is charged


def test_copies_of_one_text_in_two_documents_are_costed_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same paragraph under two documents' headers: each rendering is counted once, not
    again request after request as the two copies take turns in the cache."""
    body = prose(random.Random(10), 1_500)
    chunks = [chunk("a", body, doc_id="d1", title="One"), chunk("b", body, doc_id="d2", title="Two")]
    policy = policy_from_mapping({"budget": {"context_tokens": 40}})  # neither fits: both costed
    event = RetrievalResult(request_id="r", question="pump?", chunks=chunks)
    first = assemble(event, policy)
    counted: list[object] = []
    remember_cost = facts.remember_cost

    def spy(key: int, rendering: facts.Rendering, fields: facts.Fields, tokens: int) -> facts.TextFacts:
        counted.append(fields)
        return remember_cost(key, rendering, fields, tokens)

    monkeypatch.setattr(facts, "remember_cost", spy)
    assert assemble(event, policy) == first
    assert counted == []
    assert len(facts.known(text_key(body)).costs) == 2


def test_copies_in_one_event_leave_one_answer_a_question() -> None:
    """Two candidates of one text in one event each start from what was known before it:
    the second to learn an answer replaces the first's, never holds it twice."""
    caches.reset()
    body = prose(random.Random(11), 1_500)
    same = {"doc_id": "d", "title": "Guide"}
    event = RetrievalResult(request_id="r", question="pump?", chunks=[
        chunk("a", body, version="1", **same), chunk("b", body, version="2", **same),
        chunk("c", body, version="3", **same),
    ])
    kept = assemble(event, Policy()).audit.kept  # versions of one document: kept apart
    entry = facts.known(text_key(body))
    assert len(kept) == 3
    assert [s.title for s in entry.sketches] == ["Guide"]
    assert sorted(str(c.fields[0]) for c in entry.costs) == ["a", "b", "c"]  # chunk_ids differ


def test_a_cached_passage_cost_is_the_cost_of_its_rendering() -> None:
    """Same chunks, other labels and headers: each rendering is costed as itself."""
    rng = random.Random(7)
    chunks = [chunk(f"c{i}", prose(rng, 1_500), doc_id=f"d{i}", title=f"T{i}") for i in range(8)]
    first = RetrievalResult(request_id="r1", question="pump?", chunks=chunks)
    again = RetrievalResult(request_id="r2", question="valve?", chunks=chunks)
    for preset in ("default", "window-8k", "word-estimate", "rank-fidelity"):
        policy = load_preset(preset)
        assemble(first, policy)
        warm = assemble(again, policy)
        caches.reset()
        assert assemble(again, policy) == warm, preset


def test_a_text_seen_under_other_header_fields_or_titles_is_costed_and_compared_as_itself() -> None:
    """Passage costs and sketches are found by the text and checked against the header fields
    and title they were made with: one text under other fields, in turn, assembles as it
    would in a fresh process (the cost a drop reports; a copy found without the title line)."""
    line = " ".join(f"w{i}" for i in range(200))  # the title line, or 200 words of content
    body = prose(random.Random(8), 400)
    copy = chunk("c2", "Hose guide\n" + body, doc_id="d2", title="Hose guide")
    variants = [
        chunk("c1", f"{line}\n{body}", doc_id="d1", title=line, section="Care"),
        chunk("c1", f"{line}\n{body}", doc_id="d1", title=line, section="Care " * 9),
        chunk("c1", f"{line}\n{body}", doc_id="d1", title="Other", version="2"),
    ]
    cases = [
        (RetrievalResult(request_id="r", question="pump?", chunks=[c, copy]), policy)
        for policy in (Policy(), policy_from_mapping({"budget": {"context_tokens": 60}}))
        for c in variants
    ]
    fresh = []
    for event, policy in cases:
        caches.reset()
        fresh.append(assemble(event, policy))
    reasons = [[(d.chunk_id, d.reason, d.detail) for d in f.audit.dropped] for f in fresh]
    # The copy's body is c1's without the title line: a copy unless "Other" keeps the line.
    assert [[d[1] for d in r] for r in reasons[:3]] == [["near_duplicate"]] * 2 + [[]]
    assert len({r[0][2] for r in reasons[3:]}) == 3  # each header costs its own tokens
    runs = list(zip(cases, fresh, strict=True))
    caches.reset()
    for (event, policy), expected in runs[::-1] + runs + runs[::-1]:  # each after the others
        assert assemble(event, policy) == expected


def sized(max_bytes: int) -> SizedCache[str, str]:
    return SizedCache(max_bytes, len)


def test_sized_cache_evicts_the_least_recently_used_by_bytes() -> None:
    cache = sized(10)
    cache.put("a", "aaaa")
    cache.put("b", "bbbb")
    assert cache.get("a") == "aaaa"  # a is now the most recent
    cache.put("c", "cccc")  # 12 bytes: b goes
    assert (cache.get("b"), cache.get("a"), cache.get("c"), cache.nbytes) == (None, "aaaa", "cccc", 8)
    cache.put("a", "aaaaaa")  # replacing an entry re-charges it
    assert (len(cache), cache.nbytes) == (2, 10)
    cache.put("huge", "x" * 11)  # larger than the cap: not held, nothing flushed
    assert (cache.get("huge"), cache.get("a")) == (None, "aaaaaa")
    cache.clear()
    assert (len(cache), cache.nbytes, cache.hits, cache.misses) == (0, 0, 0, 0)


def test_token_count_cache_is_bounded_in_bytes() -> None:
    cache: BoundedCache[int] = BoundedCache(100)
    assert cache.max_bytes == 100 * COUNT_ENTRY_BYTES
    for i in range(1000):
        cache.get_or_compute(f"text {i}", len)
    assert (len(cache), cache.nbytes) == (100, 100 * COUNT_ENTRY_BYTES)


def test_sized_cache_accounting_holds_under_threads() -> None:
    """Hits take no lock; puts and evictions do: the accounting must stay exact."""
    cache = sized(1000)
    texts = [str(i) * (1 + i % 7) for i in range(500)]

    def work(offset: int) -> None:
        for i in range(2000):
            text = texts[(i * 7 + offset) % len(texts)]
            if cache.get(text) is None:
                cache.put(text, text)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert cache.nbytes == sum(len(value) for value in cache._entries.values()) <= 1000
    assert len(set(cache._entries)) == len(cache)


def test_focused_analyses_stay_under_their_cap(configure_caches: Callable[..., None]) -> None:
    """Passages cut into sentences for focused compression: each entry charged for what it
    holds, the least recently used going once the cap is reached."""
    configure_caches(sentences=128 * 1024)
    rng = random.Random(7)
    policy = load_preset("focused")
    for round_ in range(6):
        chunks = [chunk(f"c{i}", prose(rng, 3_000), doc_id=f"d{i}") for i in range(20)]
        assemble(RetrievalResult(request_id=f"r{round_}", question="pump warranty?",
                                 chunks=chunks), policy)
    cache = sentences.ANALYSES
    assert cache.nbytes == sum(e.nbytes for e in cache._entries.values()) <= cache.max_bytes
    assert cache.nbytes > cache.max_bytes * 0.8  # full, and evicting: the cap binds
    assert all(entry.nbytes >= 2 * 3_000 for entry in cache._entries.values())
