from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import app as cli
from app.config import ConfigError, load_config, parse_config

GOOD = """
sources:
  gh: {type: github, secret: "${GH_SECRET}", pipeline: p}
  am: {type: alertmanager, token: "${AM_TOKEN:-fallback-token-value}", pipeline: p}
pipelines:
  p: {model: claude-sonnet-4-6, system: triage, tools: [alert]}
tools:
  alert:
    description: Raise an alert.
    input_schema: {type: object, properties: {title: {type: string}}, required: [title]}
    topic_arn: arn:aws:sns:us-east-1:123456789012:alerts.fifo
"""


def test_env_interpolation_with_and_without_default() -> None:
    config = parse_config(GOOD, env={"GH_SECRET": "config-test-secret"})
    assert config.sources["gh"].secret is not None
    assert config.sources["gh"].secret.get_secret_value() == "config-test-secret"
    assert config.sources["am"].token is not None
    assert config.sources["am"].token.get_secret_value() == "fallback-token-value"
    assert config.tools["alert"].topic_arn == "arn:aws:sns:us-east-1:123456789012:alerts.fifo"


def test_missing_variable_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD, env={})
    assert info.value.errors == ["sources.gh.secret: environment variable GH_SECRET is not set"]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (("pipeline: p}", "pipeline: nope}"), "sources.gh.pipeline: unknown pipeline 'nope'"),
        (("tools: [alert]", "tools: [alert, ghost]"), "pipelines.p.tools: unknown tool 'ghost'"),
        (("alerts.fifo", "alerts"), "tools.alert.topic_arn: 'arn:aws:sns:us-east-1:123456789012"),
        (("type: github", "type: gitlab"), "sources.gh.type: unknown source type 'gitlab'"),
        (
            ("{type: object, properties", "{type: array, properties"),
            "tools.alert.input_schema: input_schema must have type: object",
        ),
        (('secret: "${GH_SECRET}", ', ""), "sources.gh: a 'github' source needs 'secret'"),
        (("model: claude-sonnet-4-6, ", ""), "pipelines.p.model: Field required"),
    ],
)
def test_invalid_config_errors_name_the_bad_key(change: tuple[str, str], expected: str) -> None:
    text = GOOD.replace(*change)
    assert text != GOOD
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={"GH_SECRET": "config-test-secret"})
    assert any(error.startswith(expected) for error in info.value.errors), info.value.errors


def test_not_yaml_and_not_a_mapping() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_config("sources: [unclosed", env={})
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_config("- a list", env={})


def test_builtin_config_is_valid_and_has_the_example_sources() -> None:
    config = load_config(None, env={})
    assert {name: s.type for name, s in config.sources.items()} == {
        "github": "github",
        "alerts": "alertmanager",
        "sensors": "standard-webhooks",
    }
    assert config.pipelines["triage"].tools == ["publishAlert", "publishNotification"]
    assert all(tool.topic_arn is None for tool in config.tools.values())


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_check_config_prints_sources_pipelines_and_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "eventgate.yaml"
    path.write_text(GOOD)
    monkeypatch.setenv("GH_SECRET", "from-env-secret-value")
    result = CliRunner().invoke(cli, ["check-config", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "gh: type github → pipeline p (POST /v1/webhooks/gh)" in result.output
    assert "p: model claude-sonnet-4-6; tools alert" in result.output
    assert "alert: topic arn:aws:sns:us-east-1:123456789012:alerts.fifo" in result.output
    assert "from-env-secret-value" not in result.output


def test_check_config_reports_errors_with_exit_code_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.replace("tools: [alert]", "tools: [ghost]"))
    result = CliRunner().invoke(
        cli, ["check-config", "--config", str(path)], env={"GH_SECRET": "config-test-secret"}
    )
    assert result.exit_code == 2
    assert "pipelines.p.tools: unknown tool 'ghost'" in result.output


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("{$ref: 'https://example.com/alert.json'}", "does not resolve within the schema"),
        ("{anyOf: [{}, {$ref: '#/$defs/missing'}]}", "does not resolve within the schema"),
        ("{$recursiveRef: '#'}", "$recursiveRef"),
        ("{$schema: 'http://json-schema.org/draft-07/schema#'}", "only https://json-schema"),
        (f"{{allOf: [{', '.join(['{}'] * 64)}]}}", "more than 64 schemas"),
    ],
    ids=["remote-ref", "missing-ref", "recursiveRef", "draft-07", "65-parts"],
)
def test_a_schema_whose_undeclared_keys_cannot_be_told_is_refused(schema: str, why: str) -> None:
    """Else every call of the tool would be refused (or, before, published unfiltered)."""
    text = GOOD.replace("title: {type: string}}", f"title: {{type: string}}, detail: {schema}}}")
    assert text != GOOD
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={"GH_SECRET": "config-test-secret"})
    (error,) = info.value.errors
    assert error.startswith("tools.alert.input_schema: undeclared input keys could not be"), error
    assert why in error, error
