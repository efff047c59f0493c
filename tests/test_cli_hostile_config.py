"""``check-config`` and the serving commands on config files built to hurt the parser: YAML
aliases that expand exponentially or refer to themselves, and nesting deep enough to
exhaust the stack. Each is one clear error and exit code 2, in seconds, in bounded memory;
run as a process of its own so that a hang or a runaway allocation fails the test instead
of the test run."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_config import GOOD

SECONDS = 30
MEMORY_BYTES = 2 * 1024**3


def _laughs(levels: int) -> str:
    lines = ['l0: &l0 "lol"']
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nsources: *l{levels - 1}\n"


HOSTILE = {
    "billion-laughs": _laughs(10),
    "laughs-in-a-mapping": _laughs(10).replace("sources: *l9", "pipelines: {p: {system: *l9}}"),
    "long-string-laughs": 'a: &a "'
    + "x" * 100_000
    + '"\n'
    + "b: &b ["
    + ", ".join(["*a"] * 1000)
    + "]\n"
    "c: [" + ", ".join(["*b"] * 100) + "]\n",
    "alias-to-itself": "sources: &s [*s]\n",
    "mapping-alias-to-itself": "sources: &s {gh: *s}\n",
    "deep-flow-sequence": "sources: " + "[" * 100_000 + "]" * 100_000 + "\n",
    "deep-flow-mapping": "sources: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n",
    "deep-json": '{"sources": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
    "deep-unclosed": "[" * 100_000,
    "deep-block": "".join(f"{' ' * n}a:\n" for n in range(3000)),
}


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


def _eventgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        timeout=SECONDS,
        preexec_fn=_limited,
        env={"PATH": "/usr/bin:/bin", "GH_SECRET": "config-test-secret"},
        check=False,
    )


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_config_is_one_clear_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "eventgate.yaml"
    path.write_text(text)
    result = _eventgate("check-config", "--config", str(path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "RecursionError" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"{path}: invalid (1 error)"
    assert str(path) in result.stderr.splitlines()[0]


@pytest.mark.parametrize("name", ["billion-laughs", "deep-flow-sequence"])
def test_the_gateway_refuses_a_hostile_config_before_it_starts(tmp_path: Path, name: str) -> None:
    path = tmp_path / "eventgate.yaml"
    path.write_text(HOSTILE[name])
    result = _eventgate("serve", "--config", str(path), "--port", "1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert str(path) in result.stderr


def test_anchors_and_aliases_within_bounds_still_work(tmp_path: Path) -> None:
    shared = GOOD.replace(
        "  p: {model: claude-sonnet-4-6, system: triage, tools: [alert]}",
        "  p: &triage {model: claude-sonnet-4-6, system: triage, tools: [alert]}\n"
        "  q:\n    <<: *triage\n    system: other",
    )
    path = tmp_path / "eventgate.yaml"
    path.write_text(shared)
    result = _eventgate("check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "q: model claude-sonnet-4-6; tools alert" in result.stdout
