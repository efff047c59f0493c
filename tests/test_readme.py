"""What the README promises about itself: its config example passes `eventgate check-config`."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from typer.testing import CliRunner

from app.cli import app as cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

def section(text: str, title: str) -> str:
    """The text under the `## title` heading, up to the next heading of that level."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no '## {title}' section"
    return match.group(1)


# --- (a) the config example ---------------------------------------------------------------


def readme_config_example() -> str:
    text = section(README.read_text(), "Config file")
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    assert blocks, "the README's Config file section has no yaml block"
    return str(blocks[0])


def test_the_readme_config_example_passes_check_config(tmp_path: Path) -> None:
    example = readme_config_example()
    path = tmp_path / "eventgate.yaml"
    path.write_text(example)
    # The variables the example reads, set as a user would: a `whsec_` value with a 32-byte
    # key is long enough for every kind of secret and token.
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    env = {name: secret for name in re.findall(r"\$\{(\w+)\}", example)}
    assert env, "the example reads no variable: the check below would not need any"

    result = CliRunner().invoke(cli, ["check-config", "--config", str(path)], env=env)

    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # no warning either (an unknown model would be one)
    for name in ("github", "alerts", "sensors"):
        assert f"  {name}: type " in result.stdout
