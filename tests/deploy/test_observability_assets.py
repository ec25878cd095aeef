"""The Grafana dashboard and the Prometheus alert rules in deploy/ against the worker's metrics.

Every metric a query names must be a series the worker's registry really exports (a renamed
metric would otherwise leave an empty panel or an alert that never fires), with only labels
that metric has. The registry is fed one event of each kind and a lag sample, so every
labelled family has samples to read its labels from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.factories import EXAMPLES
from worker.engine.policy import Policy
from worker.intake.codec import Limits
from worker.intake.policies import PolicyRegistry
from worker.kafka.observability.metrics import Metrics
from worker.kafka.records import HandlerContext, Origin, handle

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "context-assembler.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bcontext_assembler_[a-z_]+\b")
# Labels every scraped series gets from Prometheus, and `le` of histogram buckets.
TARGET_LABELS = {"instance", "job", "le"}
# Label names a query groups or matches by: `by (a, b)`, `{a="x"}`.
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"(context_assembler_[a-z_]+)\{([^}]*)\}")


def exported() -> dict[str, set[str]]:
    """Each series name the worker's /metrics can show, with its label names."""
    metrics = Metrics()
    context = HandlerContext(registry=PolicyRegistry(Policy()), limits=Limits(),
                             prompts_topic="p", audit_topic="a", dlq_topic="d", worker="w")
    for raw in ((EXAMPLES / "events.jsonl").read_bytes().splitlines()[0], b"{bad"):
        outcome = handle(raw, Origin("in", 0, 0, None, (), None), context)
        metrics.observe(outcome.assembly, outcome.rejected, 0.001)
    metrics.retries.inc()
    metrics.acknowledged(1_000, 2_000)
    metrics.lag.source = lambda: [("in", 0, 3)]
    series: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def dashboard_queries() -> Iterator[str]:
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            yield target["expr"]


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text("utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def queries() -> list[str]:
    return [*dashboard_queries(), *(rule["expr"] for rule in alert_rules())]


@pytest.mark.parametrize("query", queries())
def test_every_metric_a_query_names_is_exported_with_those_labels(query: str) -> None:
    series = exported()
    names = METRIC.findall(query)
    assert names, f"no worker metric in {query!r}"
    for name in names:
        assert name in series, f"{name} is not exported; exported: {sorted(series)}"
    known = set().union(*(series[name] for name in names)) | TARGET_LABELS
    used = {label.strip() for group in GROUPING.findall(query) for label in group.split(",")}
    for _, matchers in MATCHERS.findall(query):
        used |= {m.split("=")[0].strip().rstrip("!~") for m in matchers.split(",") if m.strip()}
    assert used - {""} <= known, f"unknown labels {used - known} in {query!r}"


def test_the_dashboard_shows_what_operators_watch() -> None:
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    shown = {name for query in dashboard_queries() for name in METRIC.findall(query)}
    assert {
        "context_assembler_events_total", "context_assembler_consumer_lag",
        "context_assembler_end_to_end_latency_seconds_bucket",
        "context_assembler_in_flight_events", "context_assembler_dlq_records_total",
        "context_assembler_delivery_retries_total", "context_assembler_ready",
    } <= shown
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    # queries use the dashboard's datasource variable, so it imports into any Grafana
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def test_alert_rules_cover_lag_dead_letters_readiness_and_retries() -> None:
    rules = {rule["alert"]: rule for rule in alert_rules()}
    watched = {name: {n for n in METRIC.findall(rule["expr"])} for name, rule in rules.items()}
    for metric in ("context_assembler_consumer_lag", "context_assembler_dlq_records_total",
                   "context_assembler_ready", "context_assembler_delivery_retries_total"):
        assert any(metric in names for names in watched.values()), metric
    for rule in rules.values():
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"]
        assert re.fullmatch(r"\d+[smh]", rule["for"])
        assert rule["expr"].count("(") == rule["expr"].count(")")
