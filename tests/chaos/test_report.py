"""The chaos run's schedule, latency phases and report, without a cluster."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench.chaos.faults import KINDS, schedule
from bench.chaos.report import phase_latencies, phase_of, write_report


@dataclass
class Fault:
    kind: str
    at_s: float
    end_s: float


def test_the_schedule_draws_every_kind_evenly_and_depends_only_on_the_seed() -> None:
    drawn = schedule(list(KINDS), 20, seed=3)
    assert Counter(drawn) == dict.fromkeys(KINDS, 4)
    assert drawn == schedule(list(KINDS), 20, seed=3)
    assert any(schedule(list(KINDS), 20, seed=s) != drawn for s in range(4, 8))
    assert sorted(Counter(schedule(list(KINDS), 7, seed=1)).values()) == [1, 1, 1, 2, 2]


def test_an_input_belongs_to_the_phase_of_its_creation() -> None:
    fault = Fault("kill_worker", at_s=20.0, end_s=30.0)
    assert phase_of(14.9, fault) is None
    assert phase_of(15.0, fault) == "before"
    assert phase_of(19.6, fault) is None  # too close to the start to be unaffected
    assert phase_of(20.0, fault) == phase_of(30.0, fault) == "during"
    assert phase_of(30.1, fault) == phase_of(35.0, fault) == "after"
    assert phase_of(35.1, fault) is None


def test_latencies_are_summarised_by_phase_and_by_kind() -> None:
    faults = [Fault("kill_worker", 10.0, 12.0), Fault("pause_broker", 30.0, 31.0)]
    answers = [(c + 0.05, c) for c in (6.0, 7.0, 8.0)]  # before: 50 ms
    answers += [(13.0, 10.5), (13.0, 11.0)]  # during the kill: 2.5 s and 2 s
    answers += [(31.5, 30.5)]  # during the pause: 1 s
    answers += [(14.02, 14.0)]  # after the kill: 20 ms
    summary = phase_latencies(answers, faults)
    assert summary["p99_ms"] == {"before": 50.0, "during": 2500.0, "after": 20.0}
    assert summary["by_kind"]["pause_broker"]["p99_ms"] == {
        "before": None, "during": 1000.0, "after": None}
    assert summary["by_kind"]["kill_worker"]["faults"] == 1


def test_the_report_has_the_issues_schema_and_a_picture(tmp_path: Path) -> None:
    fault = {"kind": "kill_worker", "target": "worker 1", "at_s": 2.0, "end_s": 4.0}
    run = {"guarantee": "exactly_once", "events": 3, "workers": 3, "brokers": 3,
           "faults": [fault], "lost": 0, "duplicates": 0,
           "p99_ms": {"before": 10.0, "during": 900.0, "after": 12.0},
           "timeline": [(1.1, 1.0), (5.0, 3.0), (5.2, 5.1)]}
    write_report([run], tmp_path, {"profile": "short", "seed": 1})
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runs"][0] == {k: v for k, v in run.items() if k != "timeline"}
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
