"""The collector tuning every long-running command applies once started."""

from __future__ import annotations

import gc

from context_assembler.collector import GC_THRESHOLDS, collect_less


def test_collect_less_freezes_start_up_and_raises_the_thresholds() -> None:
    before = gc.get_threshold()
    started = [object() for _ in range(100)]  # lives on past start-up
    try:
        collect_less()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() >= len(started)
        cycle: list[object] = []
        cycle.append(cycle)  # garbage made after start-up is still collected
        del cycle
        assert gc.collect() >= 1
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
