"""Guards: text the reader may not see, or that is not in force, never reaches the prompt.

Retrieval should already have filtered both; this is defence in depth, so a staff-only
procedure cannot reach a customer's prompt even when an upstream filter was skipped.
"""

from __future__ import annotations

import functools
from datetime import date
from typing import TYPE_CHECKING

from context_assembler.contract.models import DropReason
from context_assembler.engine.candidate import Candidate, Drop, brief
from context_assembler.engine.policy import GuardPolicy
from context_assembler.engine.words import has_words

if TYPE_CHECKING:
    import regex


NAMES_SHOWN = 5  # of a chunk's audience list, in a detail


def _names(allowed: list[str]) -> str:
    """A chunk's audience list as a detail shows it: its first few names, cut short."""
    names = sorted(allowed)
    shown = repr([brief(name) for name in names[:NAMES_SHOWN]])
    more = len(names) - NAMES_SHOWN
    return f"{shown[:-1]}, and {more} more]" if more > 0 else shown


@functools.cache
def _symbol() -> regex.Pattern[str]:
    """One C-speed scan, linear in the text; imported once a text without words needs it."""
    import regex

    return regex.compile(r"\p{S}")


def has_content(text: str) -> bool:
    """Words, numbers or symbols (an emoji answer, a formula) are text; only whitespace,
    punctuation, control and format characters are empty."""
    return has_words(text) or _symbol().search(text) is not None


def guard(
    candidates: list[Candidate],
    *,
    audience: str | None,
    as_of: date | None,
    policy: GuardPolicy,
) -> tuple[list[Candidate], list[Drop]]:
    """Drop what the reader may not see, what is not in force on `as_of`, and empty text."""
    if audience is not None and not audience.strip():
        audience = None  # a blank name names no one: "" must not match a chunk's [""]
    passed: list[Candidate] = []
    dropped: list[Drop] = []
    for candidate in candidates:
        chunk = candidate.chunk
        allowed = chunk.audience
        if allowed and audience is not None and audience not in allowed:
            dropped.append(candidate.drop(
                DropReason.ACCESS_DENIED,
                f"audience {brief(audience)!r} is not in {_names(allowed)}",
            ))
        elif allowed and audience is None and policy.unknown_audience == "deny":  # the default
            dropped.append(candidate.drop(
                DropReason.ACCESS_DENIED,
                f"request names no audience and the chunk is limited to {_names(allowed)}",
            ))
        elif as_of and chunk.effective_from and as_of < chunk.effective_from:
            dropped.append(candidate.drop(
                DropReason.NOT_IN_FORCE,
                f"in force from {chunk.effective_from}, asked as of {as_of}",
            ))
        elif as_of and chunk.effective_to and as_of > chunk.effective_to:
            dropped.append(candidate.drop(
                DropReason.NOT_IN_FORCE, f"in force until {chunk.effective_to}, asked as of {as_of}"
            ))
        elif not has_content(candidate.text):
            dropped.append(candidate.drop(DropReason.EMPTY, "text has no words or symbols"))
        else:
            passed.append(candidate)
    return passed, dropped
