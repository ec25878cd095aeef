"""bench-kafka's floor: a worker's CPU per event against raw aiokafka's plus the engine's."""

from __future__ import annotations

import pytest

from bench.kafka_bench import floor_ratios


def test_the_floor_is_raw_passthrough_plus_the_engine_and_each_worker_is_a_ratio_of_it() -> None:
    summary = {"raw aiokafka": {"cpu_ms_per_event": 0.14},
               "worker ALO": {"cpu_ms_per_event": 1.05},
               "worker EOS": {"cpu_ms_per_event": 0.84}}
    floor = floor_ratios(summary, engine_ms=0.56)
    assert floor["floor_ms"] == pytest.approx(0.70)
    assert floor["ratio"] == {"worker ALO": pytest.approx(1.5), "worker EOS": pytest.approx(1.2)}


def test_a_contender_left_out_of_the_run_has_no_ratio() -> None:
    summary = {"raw aiokafka": {"cpu_ms_per_event": 0.2}, "worker EOS": {"cpu_ms_per_event": 0.5}}
    assert list(floor_ratios(summary, engine_ms=0.3)["ratio"]) == ["worker EOS"]
