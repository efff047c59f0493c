"""``labelled``: a metric's child looked up once, counting where ``labels`` counts."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from app.observability import metrics
from app.observability.metrics import labelled


def test_the_child_is_looked_up_once_and_counts_where_labels_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry = CollectorRegistry()
    counter = Counter("labelled_test_total", "t", ["source", "outcome"], registry=registry)
    lookups = 0
    labels = counter.labels

    def counting(*values: str) -> Counter:
        nonlocal lookups
        lookups += 1
        return labels(*values)

    monkeypatch.setattr(counter, "labels", counting)
    for _ in range(1000):
        labelled(counter, "github", "queued").inc()
    labelled(counter, "github", "duplicate").inc(2)
    assert lookups == 2
    assert labelled(counter, "github", "queued") is labels("github", "queued")
    text = generate_latest(registry).decode()
    assert 'labelled_test_total{outcome="queued",source="github"} 1000.0' in text
    assert 'labelled_test_total{outcome="duplicate",source="github"} 2.0' in text


def test_past_the_cap_children_are_looked_up_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A label set that grows without bound (a mistake) does not grow the cache with it."""
    monkeypatch.setattr(metrics, "_CHILDREN", {})
    monkeypatch.setattr(metrics, "MAX_CHILDREN", 3)
    registry = CollectorRegistry()
    counter = Counter("labelled_cap_total", "t", ["n"], registry=registry)
    for n in range(10):
        labelled(counter, str(n)).inc()
        labelled(counter, str(n)).inc()
    assert len(metrics._CHILDREN) == 3
    assert 'labelled_cap_total{n="9"} 2.0' in generate_latest(registry).decode()
