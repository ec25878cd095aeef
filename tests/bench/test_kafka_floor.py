"""bench-kafka's verdicts: a worker's CPU per event against raw aiokafka's plus the engine's,
round by round; the at_least_once worker's p99 against raw aiokafka's at one rate."""

from __future__ import annotations

import pytest

from bench.kafka_bench import Result, floor_ratios, latency_ratio


def test_the_floor_is_raw_passthrough_plus_the_engine_and_each_worker_is_a_ratio_of_it() -> None:
    cpu = {"raw aiokafka": [0.14], "worker ALO": [1.05], "worker EOS": [0.84]}
    floor = floor_ratios(cpu, engine_ms=[0.56])
    assert floor["floor_ms"] == pytest.approx(0.70)
    assert floor["ratio"] == {"worker ALO": pytest.approx(1.5), "worker EOS": pytest.approx(1.2)}


def test_each_round_is_judged_against_its_own_floor_then_the_median_is_taken() -> None:
    """A round on a loaded machine raises the worker's CPU and the floor's alike: its ratio
    holds, where one engine figure for every round would swing every ratio with it."""
    cpu = {"raw aiokafka": [0.2, 0.4, 0.2], "worker ALO": [1.2, 2.4, 1.3]}
    floor = floor_ratios(cpu, engine_ms=[0.8, 1.6, 0.8])
    assert floor["round_ratios"]["worker ALO"] == [pytest.approx(1.2), pytest.approx(1.2),
                                                  pytest.approx(1.3)]
    assert floor["ratio"]["worker ALO"] == pytest.approx(1.2)
    assert floor["engine_ms"] == pytest.approx(0.8) and floor["floor_ms"] == pytest.approx(1.0)


def test_a_contender_left_out_of_the_run_has_no_ratio() -> None:
    cpu = {"raw aiokafka": [0.2], "worker ALO": [], "worker EOS": [0.5]}
    assert list(floor_ratios(cpu, engine_ms=[0.3])["ratio"]) == ["worker EOS"]


def _result(name: str, rate: float, p99: float) -> Result:
    return Result(name, 400.0, 1.0, 0.5, rate, p99 / 2, p99)


def test_the_latency_verdict_compares_p99s_of_the_same_round_at_one_rate() -> None:
    results = {"raw aiokafka": [_result("raw aiokafka", 150, 60), _result("raw aiokafka", 150, 80)],
               "worker ALO": [_result("worker ALO", 150, 90), _result("worker ALO", 150, 80)]}
    assert latency_ratio(results, "worker ALO") == {"rate": 150, "ratio": pytest.approx(1.25)}


def test_no_latency_verdict_when_the_rates_differ() -> None:
    results = {"raw aiokafka": [_result("raw aiokafka", 300, 60)],
               "worker ALO": [_result("worker ALO", 150, 50)]}
    assert latency_ratio(results, "worker ALO") is None
