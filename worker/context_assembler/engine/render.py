"""Labels, passage headers, the chat messages and the providers' request bodies.

Retrieved text is quoted data: it sits inside <documents> … </documents>, and anything in
it that could pass for our own structure (the delimiter tags, a line that starts like a
passage header) is neutralised, so a chunk cannot close the block or impersonate another
citable passage. The question and the history are neutralised the same way; header fields
are made one line with no bracket at all. The question comes last, where the model reads
it just before answering.

A provider format carries the same passages as the provider's own structure (Anthropic's
search_result blocks, Cohere's documents) with the same neutralised text, headers and
history, so every defence holds there too.

Look-alikes are judged on folded text, the way a model may read it: NFKC (fullwidth and
other compatibility forms become ASCII), case folded, with invisible characters removed
(format characters such as U+200B, controls that are not whitespace, and every
default-ignorable code point: variation selectors, U+034F, Hangul fillers...). Nothing is
folded at run time: the regexes spell out every form of each delimiter character (the
letters are gathered from the Unicode database at import; tests/engine/test_injection.py
checks every table against every code point), and each is a single linear pass in C, so
time stays linear in the text whatever it holds.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from datetime import date
from typing import Final, assert_never

from context_assembler.contract.models import (
    AnthropicCitationsConfig,
    AnthropicMessage,
    AnthropicRequest,
    AnthropicSearchResult,
    AnthropicText,
    Chunk,
    CohereDocument,
    CohereRequest,
    HistoryTurn,
    Message,
)
from context_assembler.engine import caches
from context_assembler.engine.policy import HeaderStyle, LabelScheme, PromptFormat, RenderPolicy

OPEN, CLOSE = "<documents>", "</documents>"
NO_PASSAGES = "No passage could be used for this question: say that you do not know."
# Header fields and dates recur across requests; formatting them costs more than a look-up
# (`caches`: "header_fields" and "validity").
CACHED_FIELD_CHARS: Final = 200  # longer values are rare: not worth their memory

# The only characters that fold to "<", "[", "]" or "/".
_ANGLE, _LEFT, _RIGHT, _SLASH = "<\ufe64\uff1c", "[\ufe47\uff3b", "]\ufe48\uff3d", "/\uff0f"
_WIDE_TRIGGERS: Final = "\ufe64\uff1c\ufe47\uff3b"  # the non-ASCII forms of "<" and "["
_OTHER_BREAKS: Final = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_BREAKS = f"\n{_OTHER_BREAKS}"  # every line break str.splitlines knows
# Regex class bodies: invisible characters, which folding removes (format characters, Cf;
# controls that are not whitespace, Cc, as of Unicode 14; and every Default_Ignorable_Code_Point
# of Unicode 15: variation selectors, the combining grapheme joiner, Hangul fillers, Mongolian
# free variation selectors, Khmer inherent vowels, tags); whitespace that breaks no line.
_INVISIBLE = (
    r"\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f"
    r"\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd"
    r"\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
)
# Runs of invisible characters, and every bracket look-alike as the ASCII bracket it folds
# to: how the citation check reads an answer's "[label]" markers as a reader sees them.
INVISIBLE_RUNS: Final = re.compile(f"[{_INVISIBLE}]+")
BRACKETS_FOLDED: Final = str.maketrans(
    {**dict.fromkeys(_LEFT[1:], "["), **dict.fromkeys(_RIGHT[1:], "]")})
_INLINE_SPACE = r"\t\x1f \xa0\u1680\u2000-\u200a\u202f\u205f\u3000"
# Blocks holding the compatibility forms of Latin letters (fullwidth, circled, superscript…);
# the tests check that no form of a letter of "documents" lies outside them.
_LETTER_FORM_BLOCKS: Final = (
    (0x80, 0x2FF), (0x1D00, 0x1EFF), (0x2070, 0x24FF), (0x3300, 0x33FF), (0xA700, 0xA7FF),
    (0xFB00, 0xFB4F), (0xFF00, 0xFFEF), (0x1F100, 0x1F1FF),
)
# Mathematical Latin letters (bold, italic, script…: U+1D400-1D6A3), taken whole for every
# letter: one range is far cheaper to test than 26 code points; the price is that "<" before
# nine styled letters of other words is defused too, which is rare and harmless.
_STYLED_LATIN = r"\U0001d400-\U0001d6a3"


def _fold(char: str) -> str:
    return unicodedata.normalize("NFKC", char).casefold()


def _spellings(word: str) -> list[str]:
    """Per letter of `word`, a regex class body of every character that folds to it; the
    last letter also takes forms that fold to more ("ß" is "ss")."""
    forms = {
        chr(point): _fold(chr(point))
        for low, high in _LETTER_FORM_BLOCKS
        for point in range(low, high + 1)
    }
    bodies = []
    for index, letter in enumerate(word):
        last = index == len(word) - 1
        spellings = [
            form for form, folded in forms.items()
            if folded == letter or (last and folded.startswith(letter))
        ]
        bodies.append(re.escape(letter + letter.upper() + "".join(spellings)) + _STYLED_LATIN)
    return bodies


# "<", blanks, an optional "/" and blanks, then "documents" in any spelling: only the "<" is
# matched (and replaced). Every run is possessive and every class excludes what may follow
# it, so no attempt backtracks: one linear pass. Two one-character checks come first (an
# ASCII bitmap, then one class): most "<" are followed by what cannot start a look-alike.
_BLANKS = rf"[\s{_INVISIBLE}]*+"
_TAG_WORD = _spellings("documents")
_TAG_TAIL = (
    rf"(?![!-.0-CE-ce-~])(?=[\s{_INVISIBLE}{_SLASH}{_TAG_WORD[0]}])"
    rf"(?={_BLANKS}[{_SLASH}]?+{_BLANKS}"
    + f"[{_INVISIBLE}]*+".join(f"[{body}]" for body in _TAG_WORD)
    + ")"
)
_TAG_LOOKALIKE = re.compile(f"<{_TAG_TAIL}")  # a literal first: the fast search
_WIDE_TAG_LOOKALIKE = re.compile(f"[{_ANGLE}]{_TAG_TAIL}")
# "[label]" after a line break and blanks; the label runs to the first "]" of the line,
# whatever its length ("[]" is no label). Groups: lead, "[", label, "]". Text that breaks
# lines only with "\n" (nearly all) gets a literal first, the fast search; the text's start
# has its own pattern.
_HEADER_TAIL = rf"([{re.escape(_LEFT)}])([^{re.escape(_RIGHT)}{_BREAKS}]++)([{re.escape(_RIGHT)}])"
_LEAD = rf"[{_INLINE_SPACE}{_INVISIBLE}]*+"
_HEADER_LIKE = re.compile(rf"(\n{_LEAD}){_HEADER_TAIL}")
_ANY_BREAK_HEADER_LIKE = re.compile(rf"([{_BREAKS}]{_LEAD}){_HEADER_TAIL}")
_FIRST_HEADER_LIKE = re.compile(rf"({_LEAD}){_HEADER_TAIL}")
# Header fields: every control becomes a space; no bracket survives. "(" and "&lt;" fold to
# nothing that delimits (a fullwidth "\uff3b" would fold straight back to "[").
_CONTROLS = str.maketrans(dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)], " "))
_HEADER_DELIMITERS = str.maketrans(
    {**dict.fromkeys(_ANGLE, "&lt;"), **dict.fromkeys(_LEFT, "("), **dict.fromkeys(_RIGHT, ")")}
)


def _defuse_headers(text: str) -> str:
    """Every "[label]" at a line start becomes "(label)", in one C-level split."""
    first = _FIRST_HEADER_LIKE.match(text)
    if first is not None:
        text = f"{first[1]}({first[3]}){text[first.end():]}"
    lines = _ANY_BREAK_HEADER_LIKE if any(b in text for b in _OTHER_BREAKS) else _HEADER_LIKE
    pieces = lines.split(text)  # text, then per match: lead, "[", label, "]", text
    found = len(pieces) // 5
    pieces[2::5], pieces[4::5] = ["("] * found, [")"] * found
    return "".join(pieces)


def neutralise(text: str) -> str:
    """Defuse delimiter look-alikes; the words themselves stay readable.

    A tag look-alike's "<" becomes "&lt;"; a header look-alike's "[label]" becomes
    "(label)". Most text holds neither "<" nor "[" nor a form of them: it is returned as is.
    """
    wide = not text.isascii() and any(char in text for char in _WIDE_TRIGGERS)
    if wide:
        text = _WIDE_TAG_LOOKALIKE.sub("&lt;", text)
    elif "<" in text:
        text = _TAG_LOOKALIKE.sub("&lt;", text)
    if wide or "[" in text:
        text = _defuse_headers(text)
    return text


def neutralise_history(turns: Sequence[HistoryTurn]) -> list[HistoryTurn]:
    """Earlier turns as the model reads them: separate messages, but neutralised too, so
    pasted text cannot pass for the documents block or a passage in a later prompt."""
    safe = []
    for turn in turns:
        content = neutralise(turn.content)
        same = content == turn.content
        safe.append(turn if same else turn.model_copy(update={"content": content}))
    return safe


def _one_line(value: str) -> str:
    """A header field: one line (controls and line breaks become spaces, runs collapse),
    with no "<", "[" or "]" in any form, so it can neither delimit nor pass for a label."""
    if not value.isprintable():
        value = value.translate(_CONTROLS)
    return " ".join(value.split()).translate(_HEADER_DELIMITERS)


_one_line_short = functools.lru_cache(caches.max_entries("header_fields"))(_one_line)
caches.register_function_cache("header_fields", _one_line_short)


def _field(value: str | None) -> str:
    if not value:
        return ""
    return _one_line_short(value) if len(value) <= CACHED_FIELD_CHARS else _one_line(value)


def label_for(scheme: LabelScheme, position: int, chunk_id: str) -> str:
    """The label a passage is cited by: its chunk_id, or its 1-based position in the context."""
    match scheme:
        case "chunk_id":
            return chunk_id
        case "S{n}":
            return f"S{position}"
        case "{n}":
            return str(position)
        case _:
            assert_never(scheme)


@functools.lru_cache(caches.max_entries("validity"))
def _validity(effective_from: date | None, effective_to: date | None) -> str:
    if effective_from is not None:
        end = f" to {effective_to}" if effective_to else ", no end date"
        return f"in force from {effective_from}{end}"
    if effective_to is not None:
        return f"in force until {effective_to}"
    return ""


caches.register_function_cache("validity", _validity)


def header(chunk: Chunk, label: str, style: HeaderStyle) -> str:
    match style:
        case "full":  # seed 000: ID, title, type, version, dates, section
            version = f"version {_field(chunk.version)}" if chunk.version else ""
            validity = _validity(chunk.effective_from, chunk.effective_to)
            kind = ", ".join(filter(None, (_field(chunk.doc_type), version, validity)))
            title = _field(chunk.title) or _field(chunk.document)
            middle = f" | {kind}" if kind else ""
            return f"[{label}] {title}{middle} | section: {_field(chunk.section) or '-'}"
        case "source_section":  # seed 003
            source = _field(chunk.source) or _field(chunk.document)
            return f"[{label}] Source: {source}, Section: {_field(chunk.section) or '-'}"
        case "inline_section":  # seed 004
            return f"[{label}] ({_field(chunk.section) or '-'})"
        case "id_score":  # seed 002
            score = "-" if chunk.score is None else f"{chunk.score:.2f}"
            return f"[{label}] source={_field(chunk.chunk_id)} score={score}"
        case _:
            assert_never(style)


def passage(chunk: Chunk, text: str, label: str, style: HeaderStyle) -> str:
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


ProviderBlock = AnthropicSearchResult | CohereDocument
_CITED = AnthropicCitationsConfig(enabled=True)


def provider_block(
    form: PromptFormat, chunk: Chunk, text: str, label: str, style: HeaderStyle
) -> ProviderBlock | None:
    """A passage as `form`'s provider takes it (None in the messages format): Anthropic's
    search_result (source, the header as title, the text), or Cohere's document (the label
    as id, the header fields present, the text)."""
    match form:
        case "messages":
            return None
        case "anthropic":
            return AnthropicSearchResult(
                source=_field(chunk.source) or _field(chunk.document) or label,
                title=header(chunk, label, style),
                content=[AnthropicText(text=neutralise(text))],
                citations=_CITED,
            )
        case "cohere":
            fields = {
                "title": _field(chunk.title) or _field(chunk.document),
                "source": _field(chunk.source),
                "section": _field(chunk.section),
                "doc_type": _field(chunk.doc_type),
                "version": _field(chunk.version),
                "in_force": _validity(chunk.effective_from, chunk.effective_to),
            }
            data = {name: value for name, value in fields.items() if value}
            return CohereDocument(id=label, data={**data, "text": neutralise(text)})
        case _:
            assert_never(form)


def block_text(block: ProviderBlock) -> str:
    """What the model reads of a block, as text: its token count, plus the policy's
    `document_overhead` for the framing, is the block's cost."""
    if isinstance(block, AnthropicSearchResult):
        return "\n".join((block.source, block.title, *(part.text for part in block.content)))
    return "\n".join(f"{name}: {value}" for name, value in block.data.items())


def question_text(question: str, passages: int) -> str:
    """The text that ends a provider request's user turn: the question, last."""
    lead = "" if passages else f"{NO_PASSAGES}\n\n"
    return f"{lead}Question: {neutralise(question)}"


def provider_request(
    history: Sequence[Message], blocks: Sequence[ProviderBlock], question: str,
    policy: RenderPolicy,
) -> AnthropicRequest | CohereRequest | None:
    """The request body of the policy's provider format, from the same parts as
    `messages`: system prompt, the (neutralised) history, the blocks, the question last."""
    ask = question_text(question, len(blocks))
    match policy.format:
        case "messages":
            return None
        case "anthropic":
            searched = [block for block in blocks if isinstance(block, AnthropicSearchResult)]
            turn = AnthropicMessage(role="user", content=[*searched, AnthropicText(text=ask)])
            earlier = [
                AnthropicMessage(role="user" if m.role == "user" else "assistant",
                                 content=m.content)
                for m in history if m.content
            ]
            return AnthropicRequest(system=policy.provider_system_prompt, messages=[*earlier, turn])
        case "cohere":
            documents = [block for block in blocks if isinstance(block, CohereDocument)]
            return CohereRequest(
                messages=[Message(role="system", content=policy.provider_system_prompt), *history,
                          Message(role="user", content=ask)],
                documents=documents,
            )
        case _:
            assert_never(policy.format)
