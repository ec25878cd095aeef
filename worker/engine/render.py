"""Labels, passage headers and the chat messages.

Retrieved text is quoted data: it sits inside <documents> … </documents>, and anything in
it that could pass for our own structure (the delimiter tags, a line that starts like a
passage header) is neutralised, so a chunk cannot close the block or impersonate another
citable passage. The question comes last, where the model reads it just before answering.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from schemas.models import Chunk, Message
from worker.engine.policy import RenderPolicy

OPEN, CLOSE = "<documents>", "</documents>"
_TAG_LOOKALIKE = re.compile(r"<(\s*/?\s*documents)", re.IGNORECASE)
_HEADER_LOOKALIKE = re.compile(r"^\[([^\]\n]{1,80})\]", re.MULTILINE)
NO_PASSAGES = "No passage could be used for this question: say that you do not know."


def neutralise(text: str) -> str:
    """Defuse delimiter look-alikes; the words themselves stay as they are."""
    text = _TAG_LOOKALIKE.sub(r"&lt;\1", text)
    return _HEADER_LOOKALIKE.sub(r"［\1］", text)  # noqa: RUF001 - fullwidth on purpose


def _field(value: str | None) -> str:
    return neutralise(" ".join(value.split())) if value else ""


def label_for(scheme: str, position: int, chunk_id: str) -> str:
    if scheme == "chunk_id":
        return chunk_id
    return scheme.replace("{n}", str(position))


def _validity(chunk: Chunk) -> str:
    if chunk.effective_from is not None:
        end = f" to {chunk.effective_to}" if chunk.effective_to else ", no end date"
        return f"in force from {chunk.effective_from}{end}"
    if chunk.effective_to is not None:
        return f"in force until {chunk.effective_to}"
    return ""


def header(chunk: Chunk, label: str, style: str) -> str:
    if style == "full":  # seed 000: ID, title, type, version, dates, section
        kind = ", ".join(
            part
            for part in (
                _field(chunk.doc_type),
                f"version {_field(chunk.version)}" if chunk.version else "",
                _validity(chunk),
            )
            if part
        )
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


def user_message(question: str, passages: Sequence[str], policy: RenderPolicy) -> str:
    block = policy.separator.join(passages)
    body = f"{OPEN}\n{block}\n{CLOSE}" if passages else f"{OPEN}\n{CLOSE}\n\n{NO_PASSAGES}"
    return f"{body}\n\nQuestion: {neutralise(question)}"


def messages(
    question: str, history: Sequence[Message], passages: Sequence[str], policy: RenderPolicy
) -> list[Message]:
    return [
        Message(role="system", content=policy.system_prompt),
        *history,
        Message(role="user", content=user_message(question, passages, policy)),
    ]
