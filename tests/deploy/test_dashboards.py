"""The Grafana dashboard and the alert rules only query metrics the gateway exports, and the
dashboard shows every metric the operating issue asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

import app.observability.metrics  # noqa: F401  (registers the metrics)

ROOT = Path(__file__).resolve().parents[2]
_NAME = re.compile(r"\beventgate_[a-z_]+")


def _exported() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("eventgate_"):
            suffixes = ("", "_total", "_bucket", "_count", "_sum", "_created")
            names |= {family.name + s for s in suffixes}
    return names


def test_dashboard_queries_exported_metrics_and_covers_the_issue() -> None:
    dashboard = json.loads((ROOT / "deploy/grafana/eventgate-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in _NAME.findall(expr)}
    assert used <= _exported(), used - _exported()
    for wanted in (
        "eventgate_webhooks_received_total",
        "eventgate_queue_depth",
        "eventgate_queue_oldest_age_seconds",
        "eventgate_llm_requests_total",
        "eventgate_llm_request_duration_seconds_bucket",
        "eventgate_llm_tokens_total",
        "eventgate_llm_cost_usd_total",
        "eventgate_circuit_breaker_state",
        "eventgate_published_total",
        "eventgate_dead_letters_total",
        "eventgate_dedup_hits_total",
        "eventgate_end_to_end_seconds_bucket",
    ):
        assert wanted in used, wanted
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_alert_rules_query_exported_metrics() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert exprs
    used = {name for expr in exprs for name in _NAME.findall(expr)}
    assert used <= _exported(), used - _exported()
