"""The Grafana dashboard and the alert rules only query metrics the gateway exports; the
dashboard has a panel for every metric of ``app.observability.metrics``, and a legend that
names each series on every panel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from app.observability import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/eventgate-dashboard.json"
_NAME = re.compile(r"\beventgate_[a-z_]+")
# The series names a query uses for a metric, by its type.
_QUERIED_AS = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}


def _exported() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith("eventgate_"):
            suffixes = ("", "_total", "_bucket", "_count", "_sum", "_created")
            names |= {family.name + s for s in suffixes}
    return names


def _panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return panels


def _defined() -> dict[str, tuple[str, ...]]:
    """Every metric ``app.observability.metrics`` defines: its name → the series names a
    query may use for it (read from each metric's own description, not listed here)."""
    defined: dict[str, tuple[str, ...]] = {}
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for family in metric.describe():
                defined[family.name] = tuple(family.name + s for s in _QUERIED_AS[family.type])
    return defined


def test_dashboard_queries_only_exported_metrics() -> None:
    exprs = [t["expr"] for panel in _panels() for t in panel["targets"]]
    used = {name for expr in exprs for name in _NAME.findall(expr)}
    assert used <= _exported(), used - _exported()
    assert len({p["id"] for p in _panels()}) == len(_panels())


def test_dashboard_has_a_panel_for_every_metric_the_gateway_defines() -> None:
    defined = _defined()
    assert len(defined) >= 20  # the module's metrics were found
    used = {
        name for panel in _panels() for t in panel["targets"] for name in _NAME.findall(t["expr"])
    }
    missing = sorted(name for name, series in defined.items() if not used & set(series))
    assert missing == []


@pytest.mark.parametrize("panel", _panels(), ids=lambda panel: str(panel["title"]))
def test_every_panel_shows_a_legend_naming_each_series(panel: dict[str, Any]) -> None:
    legend = panel.get("options", {}).get("legend", {})
    assert legend.get("showLegend") is True
    assert legend.get("displayMode") in ("list", "table")
    assert panel["targets"]
    for target in panel["targets"]:
        assert str(target.get("legendFormat", "")).strip(), target["refId"]
    formats = [t["legendFormat"] for t in panel["targets"]]
    assert len(set(formats)) == len(formats)  # two queries never share a name


def test_alert_rules_query_exported_metrics() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert exprs
    used = {name for expr in exprs for name in _NAME.findall(expr)}
    assert used <= _exported(), used - _exported()
