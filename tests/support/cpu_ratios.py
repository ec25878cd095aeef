"""Cost ratios measured in CPU time, for the tests that guard against super-linear work.

A time is noisy on a shared machine: another process can slow one side of a ratio for a
moment. A ratio over its bound is therefore measured again, up to `ROUNDS` times, and the
lowest counts. Work that really is quadratic, or a constant factor far over the bound, stays
over it every time; a moment of load does not.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

ROUNDS = 3


def best_times(*work: Callable[[], object]) -> list[float]:
    """The best of three CPU times (this thread's) of each piece of work, the pieces
    interleaved so that load from elsewhere falls on all of them alike."""
    best = [math.inf] * len(work)
    for _ in range(3):
        for index, run in enumerate(work):
            start = time.thread_time()
            run()
            best[index] = min(best[index], time.thread_time() - start)
    return best


def ratios_until_within(measure: Callable[[], float], bound: float) -> list[float]:
    """`measure()` taken again while it is at or over `bound`, at most `ROUNDS` times in all:
    the caller asserts that the lowest is under the bound and reports them all."""
    ratios = [measure()]
    while ratios[-1] >= bound and len(ratios) < ROUNDS:
        ratios.append(measure())
    return ratios
