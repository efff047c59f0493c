"""Every source ``type:`` eventgate knows. Each is described in full in its own module (its
``SourceKind``: config keys, adapter, prompt summary, trim hints); this only lists them.
Adding a type is a module with a ``SourceKind`` and a line here."""

from __future__ import annotations

from typing import Any

from app.source_config import SourceConfig
from app.sources import alerts, aws_sns, cloudevents, generic, github
from app.sources.base import AdapterDeps, Lines, SourceAdapter, SourceKind

KINDS: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (
        github.KIND,
        alerts.ALERTMANAGER,
        alerts.GRAFANA,
        generic.STANDARD_WEBHOOKS,
        cloudevents.KIND,
        generic.HMAC,
        generic.TOKEN,
        aws_sns.KIND,
    )
}


def build_adapter(
    name: str, config: SourceConfig, deps: AdapterDeps | None = None
) -> SourceAdapter:
    return KINDS[config.type].adapter(name, config, deps or AdapterDeps())


def summary_lines(source_type: str | None, event_type: str, payload: Any) -> Lines:
    """The summary a prompt starts with; none for an unknown type or a non-object payload."""
    kind = KINDS.get(source_type or "")
    if kind is None or not isinstance(payload, dict):
        return []
    return kind.summary(event_type, payload)
