"""The stages import only what is below them (docs/how-it-works.md says so)."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[1] / "app"
STAGES = (
    "ingest",
    "queue",
    "decide",
    "llm",
    "publish",
    "store",
    "admin",
    "observability",
    "console",
    "evaluate",
    "schedule",
)
# Nothing under a stage imports these: they build and hold the whole app.
FACTORY = (
    "app.main",
    "app.roles",
    "app.state",
    "app.cli",
    "app.serving",
    "app.reruns",
    "app.rerun_cli",
)
# Stages that run after ingest never reach back into it.
NOT_INGEST = ("queue", "decide", "llm", "publish", "store", "sources")


def _imports(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (APP / package).rglob("*.py"):
        tree = ast.parse(path.read_text())
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(APP.parent))] = names
    return found


def test_no_stage_imports_the_app_factory_or_its_state() -> None:
    offenders = {
        module: sorted(n for n in names if n.startswith(FACTORY))
        for stage in STAGES
        for module, names in _imports(stage).items()
        if any(n.startswith(FACTORY) for n in names)
    }
    assert offenders == {}


def test_no_later_stage_imports_ingest() -> None:
    offenders = {
        module: sorted(n for n in names if n.startswith("app.ingest"))
        for stage in NOT_INGEST
        for module, names in _imports(stage).items()
        if any(n.startswith("app.ingest") for n in names)
    }
    assert offenders == {}
