"""The citation check: which passages of a prompt an answer cites, and which labels it
cites that the prompt never gave.

A plain-text answer is read for "[label]" markers as a reader sees them: invisible
characters gone, bracket look-alikes (fullwidth U+FF3B, small U+FE47) read as brackets, markup
inside a marker ("[S<b>1</b>]", "[S**1**]") and blanks left out, letters folded (NFKC,
case), as the injection defences judge look-alikes in passages. So a label the model
invented cannot hide behind a zero-width space or a fullwidth bracket: it is read, and
reported. A marker may hold several labels ("[S1, S2]"). Anything else in brackets is read
as a label too, and reported when the prompt has no such label: the check fails closed.

A provider's response is read for the provider's own citation objects: Anthropic's
`search_result_location` (by `search_result_index`, the passage's position in the
context), Cohere's `citations[].sources[]` (by document id, the label); "[label]" markers
in its text that name no passage are reported too.

Every scan is one linear pass (the regexes have no nested quantifier); an answer is
bounded in characters and in citations, so the result is at most a small multiple of the
answer and the prompt.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from pydantic import ValidationError

from context_assembler.contract.models import (
    AnthropicRequest,
    AnthropicSearchResult,
    AssembledPrompt,
    CitationCheck,
    CitedPassage,
)
from context_assembler.engine.errors import AnswerTooLarge, UnreadableAnswer
from context_assembler.engine.render import BRACKETS_FOLDED, INVISIBLE_RUNS

# The default bounds: an answer as large as the largest event (max_event_bytes' default),
# and as many citations as a long answer makes with room to spare.
MAX_ANSWER_CHARS: Final = 4 * 1024 * 1024
MAX_CITATIONS: Final = 4096
# What a marker may hold, markup and blanks left out, to be read as a label: a chunk_id's
# length (max_chunk_id_chars' default), or the prompt's longest label if longer. Longer
# bracketed text is prose ("[as noted above ...]"), and an invented label is shown cut.
LABEL_CHARS: Final = 256
# The result's characters (each cited entry: its fields plus ENTRY_CHARS of JSON around
# them) stay within this many times what was read: the answer's text, its citation objects
# (at least CITATION_CHARS each in JSON) and the prompt's citations.
OUTPUT_FACTOR: Final = 32
ENTRY_CHARS: Final = 64
CITATION_CHARS: Final = 24

_BRACKET = re.compile(r"[\[\]]")
_TAG = re.compile(r"<[^<>]*+>")  # markup inside a marker: "<b>", "</span>"
_EMPHASIS = str.maketrans(dict.fromkeys("*_`~"))  # Markdown's marks inside a marker
_SEPARATORS = re.compile(r"[,;]")


def _shown(text: str) -> str:
    """A label as read (NFKC, blanks collapsed): how an invented one is reported."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _entry_chars(passage: CitedPassage) -> int:
    fields = (passage.label, passage.chunk_id, passage.doc_id, passage.source, passage.version)
    return ENTRY_CHARS + sum(len(field or "") for field in fields)


def _key(text: str) -> str:
    """What a reader takes a label for: no markup, no emphasis marks, no blanks, folded."""
    bare = _TAG.sub("", text).translate(_EMPHASIS)
    return "".join(unicodedata.normalize("NFKC", bare).casefold().split())


@dataclass(frozen=True, slots=True)
class _Labels:
    """The prompt's labels, found as written or as a reader reads them."""

    passages: dict[str, CitedPassage]  # by label, in context order
    by_key: dict[str, str | None]  # key -> label; None where two labels share a key
    longest: int
    chars: int  # of every passage's entry: what the prompt's citations weigh

    @classmethod
    def of(cls, prompt: AssembledPrompt) -> _Labels:
        passages = {
            c.label: CitedPassage(label=c.label, chunk_id=c.chunk_id, doc_id=c.doc_id,
                                  source=c.source, version=c.version)
            for c in prompt.citations
        }
        by_key: dict[str, str | None] = {}
        for label in passages:
            key = _key(label)
            by_key[key] = label if key not in by_key else None
        longest = max((len(key) for key in by_key), default=0)
        chars = sum(map(_entry_chars, passages.values()))
        return cls(passages, by_key, max(LABEL_CHARS, longest), chars)

    def find(self, text: str) -> str | None:
        """The label `text` names, or None."""
        if text in self.passages:
            return text
        shown = _shown(text)
        if shown in self.passages:
            return shown
        return self.by_key.get(_key(text))


class _Reading:
    """The citations read so far, in order, within the bounds."""

    def __init__(self, labels: _Labels, max_citations: int) -> None:
        self.labels = labels
        self.cited: list[CitedPassage] = []
        self.invented: dict[str, str] = {}  # by key: as first read, each label once
        self._max = max_citations
        self._read = 0
        self._room = OUTPUT_FACTOR * labels.chars  # characters the result may still take

    def allow(self, chars: int) -> None:
        """`chars` more of the answer were read: the result may grow by a multiple."""
        self._room += OUTPUT_FACTOR * chars

    def _take(self, chars: int) -> None:
        self._read += 1
        if self._read > self._max:
            raise AnswerTooLarge(f"the answer cites more than {self._max} times "
                                   "(max_citations)")
        self._room -= chars
        if self._room < 0:
            raise AnswerTooLarge(
                f"the result would be over {OUTPUT_FACTOR} times the answer and the prompt's "
                "citations (the answer cites long citations densely)")

    def cite(self, label: str) -> None:
        passage = self.labels.passages[label]
        self._take(_entry_chars(passage))
        self.cited.append(passage)

    def invent(self, label: str) -> None:
        shown = label[: self.labels.longest]
        self._take(len(shown))
        self.invented.setdefault(_key(label), shown)

    def markers(self, text: str, *, cite: bool) -> None:
        """Every "[...]" of `text`, each label cited (if `cite`) or reported invented."""
        for content in _markers(text):
            found = self.labels.find(content)
            parts = [content] if found is not None else _SEPARATORS.split(content)
            for part in parts:
                label = found if found is not None else self.labels.find(part)
                if label is not None:
                    if cite:
                        self.cite(label)
                    continue
                key = _key(part)
                if key and len(key) <= self.labels.longest:
                    self.invent(_shown(_TAG.sub("", part)))

    def result(self, prompt: AssembledPrompt) -> CitationCheck:
        named = {passage.label for passage in self.cited}
        return CitationCheck(
            request_id=prompt.request_id,
            cited=self.cited,
            invented=list(self.invented.values()),
            uncited=[label for label in self.labels.passages if label not in named],
        )


def _markers(text: str) -> Iterator[str]:
    """The text inside each innermost "[...]", as a reader sees it, in order: one pass."""
    text = INVISIBLE_RUNS.sub("", text).translate(BRACKETS_FOLDED)
    opened = -1
    for bracket in _BRACKET.finditer(text):
        at = bracket.start()
        if text[at] == "[":
            opened = at
        elif opened >= 0:
            yield text[opened + 1:at]
            opened = -1


def check_citations(
    answer: str | Mapping[str, Any],
    prompt: AssembledPrompt | Mapping[str, Any],
    *,
    max_answer_chars: int = MAX_ANSWER_CHARS,
    max_citations: int = MAX_CITATIONS,
) -> CitationCheck:
    """What `answer` (its text, or a provider's response body: Anthropic Messages or Cohere
    Chat v2) cites of `prompt` (an AssembledPrompt or its JSON); raises UnreadableAnswer."""
    if not isinstance(prompt, AssembledPrompt):
        try:
            prompt = AssembledPrompt.model_validate(prompt)
        except ValidationError as error:
            raise UnreadableAnswer(f"not an AssembledPrompt: {error.error_count()} "
                                   f"problems, the first: {error.errors()[0]['msg']}") from None
    reading = _Reading(_Labels.of(prompt), max_citations)
    if isinstance(answer, str):
        _bounded(len(answer), max_answer_chars)
        reading.allow(len(answer))
        reading.markers(answer, cite=True)
    elif isinstance(answer, Mapping) and isinstance(answer.get("content"), list):
        _anthropic(answer["content"], reading, prompt, max_answer_chars)
    elif isinstance(answer, Mapping) and isinstance(answer.get("message"), Mapping):
        _cohere(answer["message"], reading, max_answer_chars)
    else:
        raise UnreadableAnswer(
            "the answer is neither text nor a provider response this check reads (an "
            'Anthropic Messages response, with "content", or a Cohere Chat v2 response, '
            'with "message")')
    return reading.result(prompt)


def _bounded(chars: int, limit: int) -> None:
    if chars > limit:
        raise AnswerTooLarge(f"the answer's text is over max_answer_chars={limit}")


def _texts(
    blocks: Sequence[Any], reading: _Reading, limit: int
) -> Iterator[Mapping[str, Any]]:
    """The text blocks of a response's content, their text bounded in all."""
    chars = 0
    for block in blocks:
        if isinstance(block, Mapping) and isinstance(block.get("text"), str):
            chars += len(block["text"])
            _bounded(chars, limit)
            reading.allow(len(block["text"]))
            yield block


def _listed(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _anthropic(
    content: list[Any], reading: _Reading, prompt: AssembledPrompt, limit: int
) -> None:
    """Claude's citations of search results, by their index in the request: the prompt's
    context order. Where the prompt carries the request, a title or source the citation
    names must be that search result's."""
    labels = list(reading.labels.passages)
    results = _search_results(prompt)
    for block in _texts(content, reading, limit):
        for citation in _listed(block.get("citations")):
            reading.allow(CITATION_CHARS)
            kind = citation.get("type") if isinstance(citation, Mapping) else None
            index = citation.get("search_result_index") if isinstance(citation, Mapping) else None
            if kind != "search_result_location" or not isinstance(index, int) or isinstance(
                    index, bool):
                reading.invent(f"{str(kind)[:64]} citation")
            elif not 0 <= index < len(labels) or (
                    results is not None and _names_another(citation, results[index])):
                reading.invent(f"search_result_index {index}")
            else:
                reading.cite(labels[index])
        reading.markers(block["text"], cite=False)


def _search_results(prompt: AssembledPrompt) -> list[AnthropicSearchResult] | None:
    """The search results of the prompt's Anthropic request, if it carries one."""
    request = prompt.provider_request
    if not isinstance(request, AnthropicRequest) or not request.messages:
        return None
    turn = request.messages[-1].content
    return [b for b in turn if isinstance(b, AnthropicSearchResult)] if isinstance(
        turn, list) else None


def _names_another(citation: Mapping[str, Any], result: AnthropicSearchResult) -> bool:
    """Whether the citation names a title or source other than the search result's."""
    return any(isinstance(citation.get(key), str) and citation[key] != getattr(result, key)
               for key in ("title", "source"))


def _cohere(message: Mapping[str, Any], reading: _Reading, limit: int) -> None:
    """Command's citations: each names its documents by id, which is the label."""
    for citation in _listed(message.get("citations")):
        sources = citation.get("sources") if isinstance(citation, Mapping) else None
        for source in _listed(sources):
            reading.allow(CITATION_CHARS)
            named = source.get("id") if isinstance(source, Mapping) else None
            label = reading.labels.find(named) if isinstance(named, str) else None
            if label is not None:
                reading.cite(label)
            else:
                reading.invent(named if isinstance(named, str) else "source without an id")
    for block in _texts(_listed(message.get("content")), reading, limit):
        reading.markers(block["text"], cite=False)
