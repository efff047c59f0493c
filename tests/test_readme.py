"""What the README and docs/ promise about themselves: the README's config example passes
`eventgate check-config`, and every setting the gateway reads is in the settings reference
with its real default."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from app.cli import app as cli
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETTINGS_REFERENCE = ROOT / "docs" / "reference.md"


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


# --- (b) every setting in the reference, with its default ---------------------------------


def settings_fields() -> dict[str, object]:
    prefix = Settings.model_config.get("env_prefix", "")
    return {
        f"{prefix}{name}".upper(): field.default for name, field in Settings.model_fields.items()
    }


def cli_envvars() -> set[str]:
    """The environment variables the command line's options read (`--host`, `--url` ...)."""
    found: set[str] = set()

    def walk(command: Any) -> None:
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str):
                found.add(envvar)
            elif envvar:
                found.update(envvar)
        # Typer's groups are not always click.Group instances (it may carry its own click).
        for child in getattr(command, "commands", {}).values():
            walk(child)

    walk(typer.main.get_command(cli))
    return found


def reference_rows() -> dict[str, str]:
    """`| `EVENTGATE_X` | default | meaning |` rows of the settings reference: name → default."""
    rows: dict[str, str] = {}
    for line in section(SETTINGS_REFERENCE.read_text(), "Settings").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`EVENTGATE_\w+`", cells[0]):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def test_every_setting_the_gateway_reads_is_in_the_settings_reference() -> None:
    read = set(settings_fields()) | cli_envvars()
    rows = reference_rows()

    assert sorted(read - set(rows)) == []
    assert sorted(set(rows) - read) == []  # and no row for a setting nothing reads


def test_the_settings_reference_gives_each_default_as_the_code_has_it() -> None:
    rows = reference_rows()
    for name, default in settings_fields().items():
        shown = re.findall(r"`([^`]*)`", rows[name])
        if default is None:
            assert not shown, f"{name}: unset in the code, shown as {rows[name]!r}"
        elif isinstance(default, bool):
            assert shown[0] == str(default).lower(), name
        elif isinstance(default, int | float):
            assert float(shown[0]) == default, name
        else:
            assert shown[0] == str(default), name
