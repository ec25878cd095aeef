"""The Grafana dashboard and the Prometheus alert rules in deploy/ against the worker's metrics.

Every metric a query names must be a series the worker's registry really exports (a renamed
metric would otherwise leave an empty panel or an alert that never fires), with only labels
that metric has. The registry is fed one event of each kind and a lag sample, so every
labelled family has samples to read its labels from.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from context_assembler.engine.policy import Policy
from context_assembler.intake.policy_registry import PolicyRegistry
from context_assembler.kafka.records import HandlerContext, Origin, handle
from context_assembler.observability.metrics import Metrics
from context_assembler.settings import Settings
from tests.factories import EXAMPLES

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "context-assembler.json"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"
METRIC = re.compile(r"\bcontext_assembler_[a-z_]+\b")
ALERT_TESTS = ALERTS.with_name("alerts.test.yaml")
# Labels every scraped series gets from Prometheus (`namespace` from Kubernetes discovery: the
# PodMonitor, or the usual relabelling of the prometheus.io annotations), and `le` of buckets.
TARGET_LABELS = {"instance", "job", "namespace", "le"}
SCOPE = ("namespace", "job")
# Label names a query groups or matches by: `by (a, b)`, `{a="x"}`.
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHERS = re.compile(r"(context_assembler_[a-z_]+)\{([^}]*)\}")


def exported() -> dict[str, set[str]]:
    """Each series name the worker's /metrics can show, with its label names."""
    metrics = Metrics()
    context = HandlerContext(settings=Settings(prompts_topic="p", audit_topic="a",
                                               dlq_topic="d", group_id="w"),
                             registry=PolicyRegistry(Policy()))
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
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", *SCOPE]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"])


def test_the_dashboard_shows_one_deployment_at_a_time() -> None:
    """Every series is picked by the namespace and job variables, each a single choice, so
    two deployments of the worker never add up in one panel."""
    dashboard = json.loads(DASHBOARD.read_text("utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for label in SCOPE:
        assert variables[label]["multi"] is False and variables[label]["includeAll"] is False
        assert f", {label})" in variables[label]["query"]["query"]
    scope = '{namespace=~"$namespace", job=~"$job"}'
    for query in dashboard_queries():
        selectors = re.findall(r"\bcontext_assembler_[a-z_]+(\{[^}]*\})?", query)
        assert selectors and all(selector == scope for selector in selectors), query


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


def test_every_alert_is_per_deployment() -> None:
    """Grouped by namespace and job, so two deployments' series never add up to one alert."""
    for rule in alert_rules():
        if rule["expr"].lstrip().startswith("absent("):
            continue  # no series at all: no deployment to name
        groupings = [{label.strip() for label in group.split(",")}
                     for group in GROUPING.findall(rule["expr"])]
        assert groupings or "sum" not in rule["expr"], rule["alert"]
        for labels in groupings:
            assert set(SCOPE) <= labels, f"{rule['alert']} groups by {labels}"


def test_every_alert_has_promtool_tests_firing_and_not_firing() -> None:
    document = yaml.safe_load(ALERT_TESTS.read_text("utf-8"))
    assert document["rule_files"] == [ALERTS.name]
    firing: set[str] = set()
    silent: set[str] = set()
    for test in document["tests"]:
        for case in test["alert_rule_test"]:
            (firing if case["exp_alerts"] else silent).add(case["alertname"])
    names = {rule["alert"] for rule in alert_rules()}
    assert firing == names, f"never shown firing: {names - firing}"
    assert silent == names, f"never shown quiet: {names - silent}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
@pytest.mark.parametrize("command", [["check", "rules", str(ALERTS)],
                                     ["test", "rules", str(ALERT_TESTS)]])
def test_promtool_passes(command: list[str]) -> None:
    result = subprocess.run(["promtool", *command], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
