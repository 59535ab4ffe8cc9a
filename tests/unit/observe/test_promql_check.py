"""The dashboard's and the alert rules' PromQL: parsed, and every name and label checked."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from mesh.observe.promql_check import (
    Query,
    check_queries,
    exported_from_doc,
    exported_from_text,
    queries,
)

REPO = Path(__file__).resolve().parents[3]
BOARD = json.loads((REPO / "compose/grafana/dashboards/radixmesh.json").read_text())
RULES = yaml.safe_load((REPO / "compose/alerts.yml").read_text())
DOC = exported_from_doc((REPO / "docs/metrics.md").read_text())

EXPORTED = {
    "radixmesh_scheduler_queue_time_seconds_bucket": frozenset({"priority", "le"}),
    "radixmesh_scheduler_queue_time_seconds_sum": frozenset({"priority"}),
    "radixmesh_scheduler_queue_time_seconds_count": frozenset({"priority"}),
    "radixmesh_scheduler_waiting_requests": frozenset({"executor_id", "model"}),
    "radixmesh_scheduler_preemptions_total": frozenset(),
}


def problems(expr: str, shown: frozenset[str] = frozenset()) -> list[str]:
    return check_queries([Query("q", expr, shown)], EXPORTED)


def test_every_dashboard_panel_and_alert_rule_checks_against_the_documented_metrics():
    found = queries(BOARD, RULES)
    panels = [t for p in BOARD["panels"] for t in p["targets"]]
    rules = [r for g in RULES["groups"] for r in g["rules"]]
    assert len(found) == len(panels) + len(rules) >= 40
    assert check_queries(found, DOC) == []


@pytest.mark.parametrize(
    ("expr", "shown", "complaint"),
    [
        ("sum(rate(radixmesh_scheduler_preemption_total[1m]))", (), "'radixmesh_scheduler_preemption_total', which no service exports"),
        ("radixmesh_scheduler_waiting_requests_bucket", (), "which no service exports"),
        ("histogram_quantile(0.5, sum by (le) (rate(radixmesh_scheduler_queue_time_seconds_sum[1m])))", (), "by label(s) ['le'] not in its input"),
        ("histogram_quantile(0.5, sum(rate(radixmesh_scheduler_queue_time_seconds_bucket[1m])))", (), "without an le label"),
        ('radixmesh_scheduler_waiting_requests{executor="exec-0"}', (), "matches label(s) ['executor']"),
        ("sum by (priority) (radixmesh_scheduler_waiting_requests)", (), "by label(s) ['priority']"),
        ("sum(radixmesh_scheduler_waiting_requests)", ("executor_id",), "shows label(s) ['executor_id']"),
        ("radixmesh_scheduler_waiting_requests / on (model) radixmesh_scheduler_preemptions_total", (), "on label(s) ['model'] not on both sides"),
        ("sum(rate(radixmesh_scheduler_preemptions_total[1m])", (), "does not parse"),
        ("rates(radixmesh_scheduler_preemptions_total[1m])", (), "does not parse"),
    ],
)  # fmt: skip
def test_a_wrong_query_is_named_with_its_fault(expr, shown, complaint):
    (found,) = problems(expr, frozenset(shown))
    assert found.startswith("q: ") and complaint in found, found


@pytest.mark.parametrize(
    ("expr", "shown"),
    [
        ("sum by (model) (radixmesh_scheduler_waiting_requests)", ("model",)),
        ("sum without (model) (radixmesh_scheduler_waiting_requests)", ("executor_id", "instance")),
        ("histogram_quantile(0.9, sum by (le, priority) (rate(radixmesh_scheduler_queue_time_seconds_bucket[$__rate_interval])))", ("priority",)),
        ("radixmesh_scheduler_waiting_requests > 3", ("executor_id", "model", "job")),
        ("sum(rate(radixmesh_scheduler_queue_time_seconds_sum[1m])) / sum(rate(radixmesh_scheduler_queue_time_seconds_count[1m]))", ()),
        ('{__name__="radixmesh_scheduler_waiting_requests", model="m"}', ("executor_id",)),
    ],
)  # fmt: skip
def test_a_right_query_has_no_problem(expr, shown):
    assert problems(expr, frozenset(shown)) == []


def test_panels_inside_rows_and_rules_of_every_group_are_read():
    board = copy.deepcopy(BOARD)
    nested = {"type": "row", "title": "more", "panels": [
        {"title": "inside", "targets": [{"refId": "A", "expr": "radixmesh_nope", "legendFormat": "{{x}}"}]}
    ]}  # fmt: skip
    board["panels"].append(nested)
    rules = copy.deepcopy(RULES)
    rules["groups"].append({"name": "second", "rules": [{
        "alert": "Late", "expr": "sum(radixmesh_scheduler_waiting_requests) > 1",
        "annotations": {"summary": "{{ $labels.executor_id }} waits"},
    }]})  # fmt: skip
    found = check_queries(queries(board, rules), DOC)
    assert found == [
        "panel 'inside' target A: selects 'radixmesh_nope', which no service exports",
        "panel 'inside' target A: shows label(s) ['x'] its result does not have (['instance', 'job'])",
        "rule second/Late: shows label(s) ['executor_id'] its result does not have ([])",
    ]


def test_a_live_exposition_gives_each_series_its_labels():
    registry = CollectorRegistry()
    Counter("radixmesh_x_requests", "", ["code"], registry=registry).labels("OK").inc()
    Histogram("radixmesh_x_seconds", "", ["priority"], registry=registry).labels("batch").observe(1)
    Gauge("radixmesh_x_free", "", ["executor_id"], registry=registry)  # no child yet
    exported = exported_from_text([generate_latest(registry).decode()])
    assert exported["radixmesh_x_requests_total"] == {"code"}
    assert exported["radixmesh_x_seconds_bucket"] == {"priority", "le"}
    assert exported["radixmesh_x_seconds_count"] == {"priority"}
    assert exported["radixmesh_x_free"] == frozenset()  # named, its labels not yet seen
    assert "radixmesh_x_requests" not in exported and "radixmesh_x_seconds" not in exported


def test_every_alert_rule_is_whole_what_promtool_would_refuse_is_not_there():
    """What `promtool check rules` checks besides the query (no promtool here: Prometheus
    ships no wheel): unique alert names, a duration `for`, a severity, a summary."""
    from promql_parser import parse_duration

    names = []
    for group in RULES["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
            names.append(rule["alert"])
            assert parse_duration(rule["for"]).total_seconds() > 0, rule["alert"]
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
    assert len(names) == len(set(names)) >= 8
