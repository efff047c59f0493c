"""What the README and docs/ promise about themselves: the README's config example passes
`eventgate check-config`, every setting the gateway reads is in the settings reference with
its real default, and every relative link (and #anchor) resolves."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from app.cli import app as cli
from app.config import parse_config
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SETTINGS_REFERENCE = ROOT / "docs" / "reference.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*```")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def prose_lines(text: str) -> Iterator[str]:
    """The lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


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


def test_the_context_options_example_passes_check_config(tmp_path: Path) -> None:
    text = section(README.read_text(), "Context across events")
    (example,) = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    path = tmp_path / "eventgate.yaml"
    path.write_text(example)
    env = {"ALERTMANAGER_TOKEN": "whsec_" + base64.b64encode(b"k" * 32).decode()}

    result = CliRunner().invoke(cli, ["check-config", "--config", str(path)], env=env)

    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    config = parse_config(example.replace("${ALERTMANAGER_TOKEN}", env["ALERTMANAGER_TOKEN"]))
    options = {
        name: {
            key
            for key in ("history", "window", "batch", "escalate", "cache", "schedule")
            if getattr(p, key) is not None
        }
        for name, p in config.pipelines.items()
    }
    assert set().union(*options.values()) == {
        "history",
        "window",
        "batch",
        "escalate",
        "cache",
        "schedule",
    }
    assert config.pipelines["nightly"].mode == "batch"


# --- (b) every setting in the reference, with its default ---------------------------------


def settings_fields() -> dict[str, object]:
    prefix = Settings.model_config.get("env_prefix", "")
    return {
        f"{prefix}{name}".upper(): field.default for name, field in Settings.model_fields.items()
    }


def cli_envvars() -> dict[str, set[str]]:
    """The environment variables the command line's options read (`--host`, `--url` ...),
    each with its defaults (`--port` has one per command)."""
    found: dict[str, set[str]] = {}

    def walk(command: Any) -> None:
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            names = [envvar] if isinstance(envvar, str) else list(envvar or [])
            for name in names:
                found.setdefault(name, set())
                if param.default is not None:
                    found[name].add(str(param.default))
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
    read = set(settings_fields()) | set(cli_envvars())
    rows = reference_rows()

    assert sorted(read - set(rows)) == []
    assert sorted(set(rows) - read) == []  # and no row for a setting nothing reads


def test_the_settings_reference_gives_each_default_as_the_code_has_it() -> None:
    rows = reference_rows()
    for name, defaults in cli_envvars().items():
        assert defaults <= set(re.findall(r"`([^`]*)`", rows[name])), name
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


# --- (c) links ----------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """GitHub's id for a heading: the text as rendered, lowercased, punctuation dropped (word
    characters, hyphens and spaces stay), spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if match:
            slug = github_anchor(match.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            if count:
                seen[f"{slug}-{count}"] = 1
    return set(seen)


def relative_links(path: Path) -> Iterator[str]:
    for line in prose_lines(path.read_text()):
        for target in LINK.findall(INLINE_CODE.sub("", line)):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                yield target


def test_every_relative_link_and_anchor_resolves() -> None:
    broken = []
    checked = 0
    for document in DOCUMENTS:
        for target in relative_links(document):
            checked += 1
            where, _, anchor = target.partition("#")
            linked = (document.parent / where).resolve() if where else document
            if not linked.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert checked > 20  # the links were found at all
    assert broken == []


def test_github_anchors_follow_githubs_rules() -> None:
    assert github_anchor("GitHub (`type: github`)") == "github-type-github"
    assert (
        github_anchor("Claude call discipline (limits, retries, breaker, budgets, audit)")
        == "claude-call-discipline-limits-retries-breaker-budgets-audit"
    )
    assert github_anchor("Walkthrough: a signed webhook to Claude's decision") == (
        "walkthrough-a-signed-webhook-to-claudes-decision"
    )
