"""`make run` installs what running needs (no dev tools) and passes HOST / PORT to
`eventgate serve`; `make install` (what `.ci/run` calls) still installs the dev extras.
Checked with `make -n` on a venv path that does not exist: what make would run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def planned(tmp_path: Path, *args: str) -> list[str]:
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["make", "-n", f"VENV={venv}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    return [line.replace(str(venv), "VENV") for line in done.stdout.splitlines()]


def test_make_run_installs_the_runtime_only(tmp_path: Path) -> None:
    lines = planned(tmp_path, "run")
    assert "VENV/bin/python -m pip install --quiet -e ." in lines
    assert not any("[dev]" in line for line in lines)
    assert lines[-1] == "VENV/bin/eventgate serve"


def test_make_run_passes_host_and_port(tmp_path: Path) -> None:
    lines = planned(tmp_path, "run", "HOST=0.0.0.0", "PORT=9001")
    assert lines[-1] == "VENV/bin/eventgate serve --host 0.0.0.0 --port 9001"
    assert planned(tmp_path, "run", "PORT=9002")[-1] == "VENV/bin/eventgate serve --port 9002"


@pytest.mark.parametrize("target", ["install", "test", "lint"])
def test_dev_targets_install_the_dev_extras(tmp_path: Path, target: str) -> None:
    assert "VENV/bin/python -m pip install --quiet -e '.[dev]'" in planned(tmp_path, target)
