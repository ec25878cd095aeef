"""Cache keys: a text's `text_key` must not be something an event can aim at another text's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_assembler.contract.models import RetrievalResult
from context_assembler.engine import assemble, lru
from context_assembler.engine.lru import BoundedCache, text_key
from context_assembler.engine.policy import Policy
from context_assembler.engine.tokens import TiktokenCounter
from context_assembler.engine.vocabulary import load_encoding
from context_assembler.intake.codec import encode
from tests.factories import example_events

ROOT = Path(__file__).resolve().parents[2]
# Any code point, lone surrogates included (a JSON event may hold them).
TEXTS = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)


@pytest.fixture
def xxh3_always_collides(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every text gets the same xxh3-128, as a chunk crafted to collide with another would."""
    monkeypatch.setattr(lru, "_xxh3_128", lambda data: 0x0123_4567_89AB_CDEF << 32)


@pytest.mark.usefixtures("xxh3_always_collides")
def test_texts_whose_xxh3_collide_still_get_their_own_counts() -> None:
    counts: BoundedCache[int] = BoundedCache(100)
    victim, crafted = "Refunds take 5 business days.", "Refunds take 500 business days, or never."
    assert counts.get_or_compute(crafted, len) == len(crafted)
    assert counts.get_or_compute(victim, len) == len(victim)
    assert counts.get_or_compute(crafted, len) == len(crafted)


@pytest.mark.usefixtures("xxh3_always_collides")
def test_summed_part_counts_are_exact_whatever_xxh3_says() -> None:
    encoding = load_encoding("cl100k_base")
    counter = TiktokenCounter(encoding)
    parts = ["[1] a.md\nThe pump runs at 3 bar.", "\n\n", "[2] b.md\nWarranty: two years, parts only."]
    counter.count("[1] a.md\nThe pump runs at 3 bar. An entirely different passage counted first")
    assert counter.count_parts(parts) == len(encoding.encode_ordinary("".join(parts)))
    assert [counter.count(p) for p in parts] == [len(encoding.encode_ordinary(p)) for p in parts]


def _outputs(events: list[RetrievalResult]) -> list[bytes]:
    result = []
    for event in events:
        assembly = assemble(event, Policy())
        result += [encode(assembly.prompt), encode(assembly.audit)]
    return result


def test_colliding_xxh3_changes_no_assembled_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """Token counts, passage costs and word sketches are all keyed by `text_key`."""
    events = [RetrievalResult.model_validate(e) for e in example_events().values()]
    expected = _outputs(events)
    monkeypatch.setattr(lru, "_xxh3_128", lambda data: 7)
    assert _outputs(events) == expected


@given(TEXTS)
def test_equal_texts_have_equal_keys(text: str) -> None:
    copy = "".join(list(text))  # another object, its str hash not yet cached
    assert copy == text
    assert text_key(copy) == text_key(text)
    assert 0 <= text_key(text) < 2**128


@given(TEXTS, TEXTS)
def test_different_texts_have_different_keys(a: str, b: str) -> None:
    assert (text_key(a) == text_key(b)) == (a == b)


def _key_in_a_fresh_process(**env: str) -> tuple[str, str]:
    script = (
        "from context_assembler.engine.lru import STR_HASH_IS_KEYED, text_key\n"
        "print(STR_HASH_IS_KEYED, text_key('Refunds take 5 business days.'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | env,
    ).stdout.split()
    return out[0], out[1]


def test_keys_depend_on_a_secret_of_the_process_even_when_str_hashes_are_not_random() -> None:
    """A key an event could compute could be aimed at; PYTHONHASHSEED=0 makes str hashes
    computable, so the keys then come from a random key of the engine's own."""
    random_seed = [_key_in_a_fresh_process() for _ in range(2)]
    assert [keyed for keyed, _ in random_seed] == ["True", "True"]
    assert random_seed[0][1] != random_seed[1][1]
    seed_zero = [_key_in_a_fresh_process(PYTHONHASHSEED="0") for _ in range(2)]
    assert [keyed for keyed, _ in seed_zero] == ["False", "False"]
    assert seed_zero[0][1] != seed_zero[1][1]


def test_outputs_are_the_same_bytes_when_str_hashes_are_not_random() -> None:
    script = (
        "import sys\n"
        "from context_assembler.contract.models import RetrievalResult\n"
        "from context_assembler.intake.codec import encode\n"
        "from context_assembler.engine import assemble, Policy\n"
        "for line in open('examples/events.jsonl'):\n"
        "    a = assemble(RetrievalResult.model_validate_json(line), Policy())\n"
        "    sys.stdout.buffer.write(encode(a.prompt) + b'\\n' + encode(a.audit) + b'\\n')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    ).stdout
    events = [RetrievalResult.model_validate(e) for e in example_events().values()]
    assert out.splitlines() == _outputs(events)
