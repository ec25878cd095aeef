"""One INFO line now and then saying what the worker assembled, never one per event.

The first events after a quiet spell are reported a moment after they arrive (a burst is
summed, not logged event by event), later ones at most every INTERVAL_SECONDS, and what is
left when the worker stops before it leaves. An operator watching a first run sees that
something was assembled; a busy worker logs a line per interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 30.0
# After a quiet spell: long enough to gather a burst into one line.
GATHER_SECONDS = 1.0


class AssemblySummary:
    def __init__(self, interval: float = INTERVAL_SECONDS, gather: float = GATHER_SECONDS) -> None:
        self._interval = interval
        self._gather = gather
        self._prompts = 0
        self._tokens = 0
        self._rejected: Counter[str] = Counter()
        self._last_line = -interval  # monotonic time of the last line; none yet
        self._pending: asyncio.TimerHandle | None = None

    def assembled(self, prompt_tokens: int) -> None:
        self._prompts += 1
        self._tokens += prompt_tokens
        self._schedule()

    def rejected(self, reason: str) -> None:
        self._rejected[reason] += 1
        self._schedule()

    def _schedule(self) -> None:
        if self._pending is not None:
            return
        delay = max(self._gather, self._last_line + self._interval - time.monotonic())
        self._pending = asyncio.get_running_loop().call_later(delay, self.flush)

    def flush(self) -> None:
        """Log what was counted since the last line, if anything."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        rejected = sum(self._rejected.values())
        if not self._prompts and not rejected:
            return
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self._rejected.items()))
        log.info(
            "assembled %s: %s (%d prompt tokens), %s%s", _count(self._prompts + rejected, "event"),
            _count(self._prompts, "prompt"), self._tokens, _count(rejected, "dead letter"),
            f" ({reasons})" if reasons else "",
            extra={"prompts": self._prompts, "prompt_tokens": self._tokens,
                   "dead_letters": dict(sorted(self._rejected.items()))},
        )
        self._prompts = self._tokens = 0
        self._rejected.clear()
        self._last_line = time.monotonic()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
