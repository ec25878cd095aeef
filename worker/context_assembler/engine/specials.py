"""The added and special tokens a tokenizer.json declares, defused in what an event says.

A model server that tokenises the rendered prompt with the same file reads "<|im_start|>" in
retrieved text as the control token itself: a chunk could open a fake system turn. So every
occurrence of an added token in a rendered field gets its first character written as an
HTML character reference ("<" as "&lt;", as the documents tag's look-alikes are defused):
still readable, counted as the text it now is, never the token. tiktoken's path needs none
of this: `encode_ordinary` already reads such text as text.

The tokens are matched by one regex built as a trie at load (each position costs at most
the length of the longest token, which the operator's file bounds), so time stays linear
in the text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from context_assembler.contract.models import Chunk, RetrievalResult
from context_assembler.engine.errors import SpecialTokenInId
from context_assembler.engine.model_access import fields_of

# A defused character's entity could, next to the text around it, spell a token again
# (only a token holding "&", "#", ";" or digits could): a few passes settle any real file.
_MAX_PASSES: Final = 4
# Chunk fields printed in a passage as free text; chunk_id and doc_id are identifiers that
# the audit must report as sent.
_CHUNK_TEXT_FIELDS: Final = ("text", "title", "section", "source", "doc_type", "version")


def _entity(char: str) -> str:
    return "&lt;" if char == "<" else f"&#{ord(char)};"


def _trie(tokens: Iterable[str]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for token in tokens:
        node = root
        for char in token:
            node = node.setdefault(char, {})
        node[""] = {}  # a token ends here
    return root


def _pattern(node: dict[str, Any]) -> str:
    """A regex matching the start of some token below `node`, prefixes shared; where a
    token ends, the shortest match is enough: only whether one starts here matters."""
    if "" in node:
        return ""
    branches = [re.escape(char) + _pattern(child) for char, child in sorted(node.items())]
    return branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"


class SpecialTokens:
    """The tokens of one tokenizer that must never reach its server as written."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self.tokens = tuple(sorted({token for token in tokens if token.strip()}))
        # Only the first character is matched (and replaced): the rest is a lookahead, so a
        # token inside another's tail is found in the same pass.
        branches = [
            re.escape(first) + ("" if "" in rest else f"(?={_pattern(rest)})")
            for first, rest in sorted(_trie(self.tokens).items())
        ]
        self._first = re.compile("|".join(branches)) if branches else None

    def defuse(self, text: str) -> str:
        """`text` with no token of the file left in it as written."""
        if self._first is None:
            return text
        for _ in range(_MAX_PASSES):
            text, found = self._first.subn(lambda match: _entity(match.group()), text)
            if not found:
                break
        return text

    def _found_in(self, text: str) -> str | None:
        match = self._first.search(text) if self._first is not None else None
        if match is None:
            return None
        return next(token for token in self.tokens if text.startswith(token, match.start()))

    def _chunk(self, chunk: Chunk, index: int) -> Chunk:
        fields = fields_of(chunk)
        # Printed as "[chunk_id]" (a label) or bare (a header's source, a title's stand-in).
        for name, printed in (("chunk_id", f"[{chunk.chunk_id}]"), ("doc_id", chunk.doc_id)):
            token = self._found_in(printed) if printed is not None else None
            if token is not None:
                raise SpecialTokenInId(
                    f"chunks[{index}].{name} spells {token[:40]!r}, a token the policy's "
                    "tokenizer reads as a control token; identifiers are cited as sent, so "
                    "it cannot be defused"
                )
        changed = {
            name: safe for name in _CHUNK_TEXT_FIELDS
            if fields[name] is not None and (safe := self.defuse(fields[name])) != fields[name]
        }
        return chunk.model_copy(update=changed) if changed else chunk

    def event(self, event: RetrievalResult) -> RetrievalResult:
        """`event` with every free-text field defused (the same object if nothing was);
        raises SpecialTokenInId for an identifier that spells a token."""
        if self._first is None:
            return event
        chunks = [self._chunk(chunk, index) for index, chunk in enumerate(event.chunks)]
        history = [
            turn if (safe := self.defuse(turn.content)) == turn.content
            else turn.model_copy(update={"content": safe})
            for turn in event.history
        ]
        question = self.defuse(event.question)
        same = (question == event.question
                and all(a is b for a, b in zip(chunks, event.chunks, strict=True))
                and all(a is b for a, b in zip(history, event.history, strict=True)))
        if same:
            return event
        return event.model_copy(update={"question": question, "chunks": chunks,
                                        "history": history})
