"""Labels, passage headers and the chat messages.

Retrieved text is quoted data: it sits inside <documents> … </documents>, and anything in
it that could pass for our own structure (the delimiter tags, a line that starts like a
passage header) is neutralised, so a chunk cannot close the block or impersonate another
citable passage. The question comes last, where the model reads it just before answering.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from datetime import date
from typing import Final

from schemas.models import Chunk, Message
from worker.engine.policy import RenderPolicy

OPEN, CLOSE = "<documents>", "</documents>"
_TAG_LOOKALIKE = re.compile(r"<(\s*/?\s*documents)", re.IGNORECASE)
_HEADER_LOOKALIKE = re.compile(r"^\[([^\]\n]{1,80})\]", re.MULTILINE)
NO_PASSAGES = "No passage could be used for this question: say that you do not know."
# Header fields and dates recur across requests; formatting them costs more than a look-up.
CACHE_ENTRIES: Final = 16_384
CACHED_FIELD_CHARS: Final = 200  # longer values are rare: not worth their memory


def neutralise(text: str) -> str:
    """Defuse delimiter look-alikes; the words themselves stay as they are.

    Most text holds neither "<" nor "[": a fast scan for them skips both regexes.
    """
    if "<" in text:
        text = _TAG_LOOKALIKE.sub(r"&lt;\1", text)
    if "[" in text:
        text = _HEADER_LOOKALIKE.sub(r"［\1］", text)  # noqa: RUF001 - fullwidth on purpose
    return text


def _tidy(value: str) -> str:
    return neutralise(" ".join(value.split()))


_tidy_short = functools.lru_cache(maxsize=CACHE_ENTRIES)(_tidy)  # metadata values recur


def _field(value: str | None) -> str:
    if not value:
        return ""
    return _tidy_short(value) if len(value) <= CACHED_FIELD_CHARS else _tidy(value)


def label_for(scheme: str, position: int, chunk_id: str) -> str:
    if scheme == "chunk_id":
        return chunk_id
    return scheme.replace("{n}", str(position))


@functools.lru_cache(maxsize=CACHE_ENTRIES)
def _validity(effective_from: date | None, effective_to: date | None) -> str:
    if effective_from is not None:
        end = f" to {effective_to}" if effective_to else ", no end date"
        return f"in force from {effective_from}{end}"
    if effective_to is not None:
        return f"in force until {effective_to}"
    return ""


def header(chunk: Chunk, label: str, style: str) -> str:
    if style == "full":  # seed 000: ID, title, type, version, dates, section
        version = f"version {_field(chunk.version)}" if chunk.version else ""
        validity = _validity(chunk.effective_from, chunk.effective_to)
        kind = ", ".join(filter(None, (_field(chunk.doc_type), version, validity)))
        title = _field(chunk.title) or _field(chunk.document)
        middle = f" | {kind}" if kind else ""
        return f"[{label}] {title}{middle} | section: {_field(chunk.section) or '-'}"
    if style == "source_section":  # seed 003
        source = _field(chunk.source) or _field(chunk.document)
        return f"[{label}] Source: {source}, Section: {_field(chunk.section) or '-'}"
    if style == "inline_section":  # seed 004
        return f"[{label}] ({_field(chunk.section) or '-'})"
    if style == "id_score":  # seed 002
        score = "-" if chunk.score is None else f"{chunk.score:.2f}"
        return f"[{label}] source={_field(chunk.chunk_id)} score={score}"
    raise ValueError(f"unknown header style {style!r}")


def passage(chunk: Chunk, text: str, label: str, style: str) -> str:
    """A passage exactly as the model reads it; its token count is its cost."""
    joiner = " " if style == "inline_section" else "\n"
    return f"{header(chunk, label, style)}{joiner}{neutralise(text)}"


def user_parts(question: str, passages: Sequence[str], policy: RenderPolicy) -> list[str]:
    """The user message in parts, so counting it can reuse cached counts (`count_parts`)."""
    question_part = f" {neutralise(question)}"
    if not passages:
        return [f"{OPEN}\n{CLOSE}\n\n{NO_PASSAGES}\n\nQuestion:", question_part]
    parts = [f"{OPEN}\n"]
    for text in passages:
        parts += [text, policy.separator]
    parts[-1] = f"\n{CLOSE}\n\nQuestion:"  # after the last passage: close, no separator
    return [*parts, question_part]


def messages(
    history: Sequence[Message], user: Sequence[str], policy: RenderPolicy
) -> list[Message]:
    """System, history, then the user message `user_parts` built (the question last)."""
    return [
        Message(role="system", content=policy.system_prompt),
        *history,
        Message(role="user", content="".join(user)),
    ]
