"""Guards: text the reader may not see, or that is not in force, never reaches the prompt.

Retrieval should already have filtered both; this is defence in depth, so a staff-only
procedure cannot reach a customer's prompt even when an upstream filter was skipped.
"""

from __future__ import annotations

import functools
from datetime import date
from typing import TYPE_CHECKING

from schemas.models import DropReason
from worker.engine.candidate import Candidate, Drop
from worker.engine.policy import GuardPolicy
from worker.engine.words import has_words

if TYPE_CHECKING:
    import regex


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
    passed: list[Candidate] = []
    dropped: list[Drop] = []
    for candidate in candidates:
        chunk = candidate.chunk
        allowed = chunk.audience
        if allowed and audience is not None and audience not in allowed:
            dropped.append(candidate.drop(
                DropReason.ACCESS_DENIED,
                f"audience {audience!r} is not in {sorted(allowed)}",
            ))
        elif allowed and audience is None and policy.unknown_audience == "deny":  # the default
            dropped.append(candidate.drop(
                DropReason.ACCESS_DENIED,
                f"request names no audience and the chunk is limited to {sorted(allowed)}",
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
