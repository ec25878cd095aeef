"""Token counting: real tokenizers (tiktoken, a model's tokenizer.json) and the two
estimators the seeds use.

A passage's cost is the token count of its rendered form. Counts of real tokenizers are
cached per text, so a popular chunk is tokenised once per process, and a prompt made of
passages is counted from their cached counts (`count_parts`).

As in tiktoken, the counters are a pure core (no file, no environment: a `TiktokenCounter`
is handed a ready `tiktoken.Encoding`) fed by one loader, `vocabulary.py`, and
`get_counter` is the one lazy entry, like tiktoken's `get_encoding`. The policy registry
calls it for every policy it holds, so a missing vocabulary stops the process at start.
A tokenizer.json is loaded by `load_tokenizer_file` when its policy file is read, and is
named after its content (`hf:sha256:<hex>`): the same name always counts the same.
"""

from __future__ import annotations

import functools
import math
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal, NewType, Protocol

from context_assembler.engine import caches, vocabulary
from context_assembler.engine.errors import VocabularyUnavailable
from context_assembler.engine.lru import BoundedCache, text_key
from context_assembler.engine.specials import SpecialTokens

if TYPE_CHECKING:  # imported where a vocabulary is loaded, on first use
    import tiktoken
    import tokenizers

ExactTokenizerName = Literal["cl100k_base", "o200k_base"]
TokenizerName = Literal["cl100k_base", "o200k_base", "chars/4", "words*1.3"]
EXACT_TOKENIZERS: Final[tuple[ExactTokenizerName, ...]] = ("cl100k_base", "o200k_base")
TOKENIZERS: Final[tuple[TokenizerName, ...]] = ("cl100k_base", "o200k_base", "chars/4", "words*1.3")
# A tokenizer.json, by the sha256 of its bytes: what a policy holds once its file is read.
HfTokenizerName = NewType("HfTokenizerName", str)
HF_TOKENIZER: Final = re.compile(r"hf:sha256:[0-9a-f]{64}")
# tiktoken's `encode_ordinary` lets go of the GIL while it counts: worth it for a long text
# (the event loop runs meanwhile), but a short one (a question, a seam between two cached
# parts) is counted in a few microseconds, and then waits for the GIL to come back, up to the
# 5 ms switch interval behind a busy event loop (measured: 4 us alone, 590 us beside a busy
# thread). Shorter texts are counted without letting it go.
HOLD_GIL_BELOW_CHARS: Final = 1024


class TokenCounter(Protocol):
    @property
    def name(self) -> str: ...

    def count(self, text: str) -> int: ...

    def count_parts(self, parts: Sequence[str]) -> int:
        """The exact count of `"".join(parts)`."""
        ...

    def count_known(self, parts: Sequence[str], counts: Sequence[int | None]) -> int:
        """`count_parts`, given the counts of some parts (None: not known)."""
        ...

    def remember(self, text: str, tokens: int) -> None:
        """Hold `tokens` as the count of `text`, worked out exactly from its parts, so
        that counting `text` later is a cache hit."""
        ...

    def count_rest(self, tokens: int, left: str, right: str) -> int | None:
        """The count of `right`, where `left + right` counts `tokens` and that says it
        exactly (no token spans the seam); None where it does not."""
        ...


class CharsPerFour:
    """Seed 000's estimate: ceil(characters / 4)."""

    name = "chars/4"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / 4)

    def count_parts(self, parts: Sequence[str]) -> int:
        return math.ceil(sum(map(len, parts)) / 4)

    def count_known(self, parts: Sequence[str], counts: Sequence[int | None]) -> int:
        return self.count_parts(parts)

    def remember(self, text: str, tokens: int) -> None:
        """Nothing to hold: counting is arithmetic."""

    def count_rest(self, tokens: int, left: str, right: str) -> int | None:
        return self.count(right)


class WordsTimesOnePointThree:
    """Seed 003's estimate: whitespace words x 1.3, rounded up (integer arithmetic)."""

    name = "words*1.3"

    def count(self, text: str) -> int:
        return (len(text.split()) * 13 + 9) // 10

    def count_parts(self, parts: Sequence[str]) -> int:
        return self.count("".join(parts))

    def count_known(self, parts: Sequence[str], counts: Sequence[int | None]) -> int:
        return self.count_parts(parts)

    def remember(self, text: str, tokens: int) -> None:
        """Nothing to hold: counting is arithmetic."""

    def count_rest(self, tokens: int, left: str, right: str) -> int | None:
        return self.count(right)


class TiktokenCounter:
    """Exact counts for OpenAI encodings, cached per text.

    `encode_ordinary` treats special-token text such as "<|endoftext|>" inside a chunk as
    plain text instead of raising, and is slightly faster than `encode`.
    """

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self.name = encoding.name
        self._encoding = encoding
        self._core = encoding._core_bpe
        self.cache: BoundedCache[int] = caches.count_cache("tokens")

    def _count_uncached(self, text: str) -> int:
        if len(text) < HOLD_GIL_BELOW_CHARS:
            try:  # as encode_ordinary counts, GIL held (`_core_bpe`: as tiktoken's encode_to_numpy)
                return memoryview(self._core.encode_to_tiktoken_buffer(text, _NONE)).nbytes // 4
            except UnicodeEncodeError:  # lone surrogates: encode_ordinary replaces them first
                pass
        return len(self._encoding.encode_ordinary(text))

    def count(self, text: str) -> int:
        return self.cache.get_or_compute(text, self._count_uncached)

    def count_parts(self, parts: Sequence[str]) -> int:
        """The exact count of the joined parts, from cached counts wherever possible.

        Where two parts meet at a cut, their counts add up. Where they do not (a passage
        ending in "." before a blank-line separator), the left part is cut at its last space
        instead, and only its last word is counted again, together with what follows.
        """
        total, pending = 0, ""
        for part in parts:
            if _is_cut(pending, part):
                total += self.count(pending)
                pending = part
                continue
            cut = _last_cut(pending)
            if cut:  # count(pending) == count(pending[:cut]) + count(pending[cut:])
                total += self.count(pending) - self.count(pending[cut:])
                pending = pending[cut:]
            pending += part
        return total + self.count(pending)

    def count_known(self, parts: Sequence[str], counts: Sequence[int | None]) -> int:
        """Where every two parts meet at a cut, the counts add up: the known ones are not
        counted again (nor their texts hashed)."""
        if not all(map(_is_cut, parts, parts[1:])):
            return self.count_parts(parts)
        return sum(self.count(part) if known is None else known
                   for part, known in zip(parts, counts, strict=True))

    def remember(self, text: str, tokens: int) -> None:
        self.cache.put(text_key(text), tokens)

    def count_rest(self, tokens: int, left: str, right: str) -> int | None:
        if _is_cut(left, right):  # count(left + right) == count(left) + count(right)
            return tokens - self.count(left)
        return None


_NONE: Final[frozenset[str]] = frozenset()  # no special tokens: their text counts as text


def _is_cut(left: str, right: str) -> bool:
    """Whether no token can span left|right, so that each side can be counted alone.

    tiktoken (cl100k_base, o200k_base) splits text with a regex before merging tokens within
    each piece; a piece may start with a space or end with newlines, but never holds a
    newline followed by "[", nor a non-space followed by a space. Nor a run of blanks ending
    in a space together with the " word" after it: the run's last space goes with the word
    (blanks before a non-blank leave it their last space), so a left side ending in a space
    meets " word" at a cut too.
    """
    if not left or not right:
        return False
    if right[0] == "[":
        return left[-1] == "\n"
    if right[0] != " ":
        return False
    return not left[-1].isspace() or (left[-1] == " " and right[1:2].strip() != "")


def _last_cut(text: str) -> int:
    """The position of the last space after a non-space (a cut), or 0 if there is none."""
    cut = text.rfind(" ")
    while cut > 0 and text[cut - 1].isspace():
        cut = text.rfind(" ", 0, cut)
    return max(cut, 0)


class HuggingFaceCounter:
    """Exact counts with a model's own tokenizer.json, cached per text.

    Special tokens the file declares are matched in the text, as the model's server does
    when it tokenises the rendered prompt (`specials`: the engine defuses them in every
    field an event renders); none is added (no BOS): chat framing is
    `budget.message_overhead`'s. The binding's borrow checks can refuse ("Already
    borrowed") a call on one tokenizer made from two threads at once, hence the lock; the
    call itself releases the GIL, so other threads run meanwhile.
    """

    def __init__(self, name: HfTokenizerName, tokenizer: tokenizers.Tokenizer) -> None:
        self.name = name
        self._tokenizer = tokenizer
        # Read by its server as control tokens: the engine defuses them in what events say.
        self.specials = SpecialTokens(
            token.content for token in tokenizer.get_added_tokens_decoder().values()
        )
        self._lock = threading.Lock()
        self.cache: BoundedCache[int] = caches.count_cache("tokens")

    def _count_uncached(self, text: str) -> int:
        try:
            return self._encoded_length(text)
        except TypeError:  # a lone surrogate: counted as U+FFFD, as tiktoken does
            return self._encoded_length(
                text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
            )

    def _encoded_length(self, text: str) -> int:
        """A batch of one: the batch call skips the character offsets `encode` works out
        (1.5x the library's speed; 1.2x on a cold event, paired)."""
        with self._lock:
            return len(self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0])

    def count(self, text: str) -> int:
        return self.cache.get_or_compute(text, self._count_uncached)

    def count_parts(self, parts: Sequence[str]) -> int:
        """Counts the joined text whole: model families split text before merging in ways
        no one cut rule covers (byte-level regexes, a Metaspace prefix on the first word
        only, normalizers), so a sum of parts could miss a merge across a seam."""
        return self.count("".join(parts))

    def count_known(self, parts: Sequence[str], counts: Sequence[int | None]) -> int:
        return self.count_parts(parts)  # no cut rule: the joined text, as `count_parts`

    def remember(self, text: str, tokens: int) -> None:
        self.cache.put(text_key(text), tokens)

    def count_rest(self, tokens: int, left: str, right: str) -> int | None:
        """None: no cut rule says the counts of parts add up (`count_parts`)."""
        return None


_lock = threading.Lock()
_hf_counters: dict[HfTokenizerName, HuggingFaceCounter] = {}


@functools.cache
def _tiktoken_counter(name: str) -> TiktokenCounter:
    return TiktokenCounter(vocabulary.load_encoding(name))


def load_tokenizer_file(path: Path) -> HuggingFaceCounter:
    """The counter for a Hugging Face tokenizer.json (raises VocabularyUnavailable); from
    then on `get_counter` finds it by its name, `hf:sha256:<hex of the file>`."""
    digest, tokenizer = vocabulary.load_tokenizer_file(path)
    name = HfTokenizerName(f"hf:sha256:{digest}")
    with _lock:
        counter = _hf_counters.get(name)
        if counter is None:
            counter = _hf_counters[name] = HuggingFaceCounter(name, tokenizer)
        return counter


def get_counter(name: TokenizerName | HfTokenizerName) -> TokenCounter:
    """One shared counter per tokenizer name (tiktoken encodings are costly to build).

    The first call for a tiktoken encoding loads its vocabulary, and a tokenizer.json must
    have been loaded (both raise VocabularyUnavailable otherwise).
    """
    if name == "chars/4":
        return CharsPerFour()
    if name == "words*1.3":
        return WordsTimesOnePointThree()
    if HF_TOKENIZER.fullmatch(name):
        counter = _hf_counters.get(HfTokenizerName(name))
        if counter is None:
            raise VocabularyUnavailable(
                f"tokenizer {name} is not loaded: name its tokenizer.json in a policy file "
                '([tokenizer] encoding = "hf:PATH"), which loads it'
            )
        return counter
    if name not in TOKENIZERS:
        raise ValueError(
            f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}, "
            "or hf:PATH (a tokenizer.json)"
        )
    with _lock:  # functools.cache alone may build the same encoding twice under threads
        return _tiktoken_counter(name)
