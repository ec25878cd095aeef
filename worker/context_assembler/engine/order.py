"""Where each kept passage sits: models read the start and the end of a context best.

Input is the kept passages in rank order (best first). Modes:
- rank: as ranked (seed 000).
- edges: best at both ends, weakest in the middle, alternating (seed 001).
- first_last: best first, second best last, the rest between (seed 002).
- round_robin_source: one passage per source per round, sources in order of their best
  passage (seed 004's rule), so one source cannot stack its passages on top.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar, assert_never

from context_assembler.engine.policy import OrderMode

T = TypeVar("T")


def edges(items: Sequence[T]) -> list[T]:
    head = list(items[0::2])
    tail = list(items[1::2])
    return head + tail[::-1]


def first_last(items: Sequence[T]) -> list[T]:
    if len(items) <= 2:
        return list(items)
    return [items[0], *items[2:], items[1]]


def round_robin(items: Sequence[T], source: Callable[[T], str]) -> list[T]:
    pools: dict[str, list[T]] = {}
    for item in items:
        pools.setdefault(source(item), []).append(item)
    ordered: list[T] = []
    depth = 0
    while len(ordered) < len(items):
        ordered.extend(pool[depth] for pool in pools.values() if depth < len(pool))
        depth += 1
    return ordered


def arrange(items: Sequence[T], mode: OrderMode, source: Callable[[T], str]) -> list[T]:
    match mode:
        case "rank":
            return list(items)
        case "edges":
            return edges(items)
        case "first_last":
            return first_last(items)
        case "round_robin_source":
            return round_robin(items, source)
        case _:
            assert_never(mode)
