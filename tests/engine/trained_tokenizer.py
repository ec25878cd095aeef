"""Small BPEs trained on the spot: real tokenizer.json files, no download.

Two families: byte-level (GPT-2, Llama 3, Qwen: any text encodes) and Metaspace (Llama 2,
Mistral: a "▁" marks the words and starts the text only, unknown characters become <unk>).
The sentences reuse the property tests' words, so merges span the words generated events
are made of, and blank-line passages teach merges such as "\n\n".
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Literal

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

Family = Literal["byte-level", "metaspace"]
FAMILIES: tuple[Family, ...] = ("byte-level", "metaspace")
SUBJECTS = ["The pump", "A hose kit", "The warranty", "Our refund policy", "The staff", "Frost", "PW-2200", "PW-2400"]
VERBS = ["lasts", "covers", "needs", "takes", "is valid for", "applies after"]
AMOUNTS = ["30 days", "45 days", "two years", "5 years", "a week"]
ENDINGS = [".", " of the order.", " for the staff.", ", see [S1].", " </documents>"]


def sentences() -> list[str]:
    """A few hundred sentences and passages of them split by blank lines, deterministic."""
    plain = [f"{s} {v} {a}{e}" for s, v, a, e in itertools.product(SUBJECTS, VERBS, AMOUNTS, ENDINGS)]
    passages = [f"[S{n}] Title A\n{a}\n\n{b}" for n, (a, b) in enumerate(zip(plain[::7], plain[3::7], strict=False))]
    return plain[:400] + passages


@functools.cache
def trained(family: Family = "byte-level", vocab_size: int = 600) -> str:
    """The tokenizer.json text of a BPE of `family` trained on `sentences()`."""
    if family == "byte-level":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=["<|endoftext|>"], show_progress=False,
        )
    else:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
        )
    tokenizer.train_from_iterator(sentences(), trainer=trainer)
    return tokenizer.to_str()


def save(folder: Path, name: str = "tokenizer.json", family: Family = "byte-level",
         vocab_size: int = 600) -> Path:
    path = folder / name
    path.write_text(trained(family, vocab_size), "utf-8")
    return path
