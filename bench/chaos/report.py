"""Latency by phase of each fault, and the report: out/chaos/report.json and timeline.png."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

WINDOW_SECONDS = 5.0  # "before" and "after" a fault
MARGIN_SECONDS = 0.5  # an input created this close to a fault's start is not "before" it
PHASES = ("before", "during", "after")


class Timed(Protocol):
    kind: str
    at_s: float
    end_s: float


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 1)


def phase_of(created: float, fault: Timed) -> str | None:
    if fault.at_s - WINDOW_SECONDS <= created < fault.at_s - MARGIN_SECONDS:
        return "before"
    if fault.at_s <= created <= fault.end_s:
        return "during"
    if fault.end_s < created <= fault.end_s + WINDOW_SECONDS:
        return "after"
    return None


def phase_latencies(answers: Iterable[tuple[float, float]],
                    faults: Sequence[Timed]) -> dict[str, Any]:
    """p50/p99 (ms) of the answers (arrival s, created s) by phase, over every fault and by
    kind; an answer in two faults' windows counts for each."""
    by: dict[str, dict[str, list[float]]] = {}
    overall: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for arrival, created in answers:
        latency = (arrival - created) * 1000
        for fault in faults:
            phase = phase_of(created, fault)
            if phase is not None:
                overall[phase].append(latency)
                by.setdefault(fault.kind, {p: [] for p in PHASES})[phase].append(latency)

    def summary(groups: dict[str, list[float]]) -> dict[str, dict[str, float | None]]:
        return {"p50_ms": {p: quantile(groups[p], 0.5) for p in PHASES},
                "p99_ms": {p: quantile(groups[p], 0.99) for p in PHASES},
                "max_ms": {p: quantile(groups[p], 1.0) for p in PHASES}}

    return {**summary(overall),
            "by_kind": {kind: {**summary(groups), "faults": sum(f.kind == kind for f in faults)}
                        for kind, groups in sorted(by.items())}}


def write_report(runs: list[dict[str, Any]], out: Path, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    public = [{k: v for k, v in run.items() if k != "timeline"} for run in runs]
    (out / "report.json").write_text(json.dumps({**meta, "runs": public}, indent=2) + "\n")
    draw(runs, out / "timeline.png")


def draw(runs: list[dict[str, Any]], path: Path) -> None:
    """Answers/s, lag (inputs created minus answered) and p99 latency per second, faults
    shaded; one column per run."""
    import matplotlib  # lazily: only the report needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, len(runs), figsize=(7 * len(runs), 9), squeeze=False,
                             sharex="col")
    colors = {"kill_worker": "tab:red", "pause_worker": "tab:orange",
              "kill_leader_broker": "tab:purple", "pause_broker": "tab:blue",
              "add_remove_worker": "tab:green"}
    for column, run in enumerate(runs):
        timeline: list[tuple[float, float]] = run["timeline"]
        end = int(max((a for a, _ in timeline), default=0)) + 2
        answered = [0] * end
        created = [0] * end
        worst: list[list[float]] = [[] for _ in range(end)]
        for arrival, made in timeline:
            answered[max(0, int(arrival))] += 1
            created[max(0, min(end - 1, int(made)))] += 1
            worst[max(0, min(end - 1, int(made)))].append((arrival - made) * 1000)
        lag, backlog = [], 0
        for second in range(end):
            backlog += created[second] - answered[second]
            lag.append(backlog)
        seconds = list(range(end))
        p99 = [quantile(w, 0.99) or float("nan") for w in worst]
        top, middle, bottom = axes[0][column], axes[1][column], axes[2][column]
        top.plot(seconds, answered, lw=0.8)
        top.set_title(f"{run['guarantee']}: {run['events']} events, {run['workers']} workers, "
                      f"{run['brokers']} brokers; lost {run['lost']}, dup {run['duplicates']}")
        top.set_ylabel("answers/s")
        middle.plot(seconds, lag, lw=0.8, color="tab:gray")
        middle.set_ylabel("lag (events)")
        bottom.plot(seconds, p99, lw=0.8, color="black")
        bottom.set_yscale("log")
        bottom.set_ylabel("p99 latency (ms) by input second")
        bottom.set_xlabel("seconds")
        for fault in run["faults"]:
            for axis in (top, middle, bottom):
                axis.axvspan(fault["at_s"], fault["end_s"], alpha=0.2,
                             color=colors.get(fault["kind"], "tab:gray"))
            top.annotate(fault["kind"].replace("_", " "), (fault["at_s"], 1.0),
                         xycoords=("data", "axes fraction"), rotation=90, fontsize=6,
                         va="top")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
