from __future__ import annotations

import re
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


MANY_MISTAKES = """
sources:
  github: {type: github, secret: "${UNSET_GH_SECRET}", pipeline: triage, split: true}
  alerts: {type: alertmanager, token: short, pipeline: nowhere}
  bad name: {type: token, token: long-enough-token-value, pipeline: triage}
pipelines:
  triage: {model: claude-sonnet-4-5, system: triage, tools: [alert, ghost], max_tokens: 0}
tools:
  alert:
    description: Raise an alert.
    input_schema: {type: array}
    topic_arn: arn:aws:sns:us-east-1:123456789012:alerts
"""


def test_every_error_of_a_file_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(MANY_MISTAKES, env={})
    errors = info.value.errors
    expected = [
        "sources.github.secret: environment variable UNSET_GH_SECRET is not set",
        "sources.github.split: not used by a 'github' source",
        "sources.alerts.token: the value has 5 characters",
        "sources.alerts.pipeline: unknown pipeline 'nowhere'",
        "sources.bad name: name must match",
        "pipelines.triage.max_tokens: Input should be greater than or equal to 1",
        "pipelines.triage.tools: unknown tool 'ghost'",
        "tools.alert.input_schema: input_schema must have type: object",
        "tools.alert.topic_arn: 'arn:aws:sns:us-east-1:123456789012:alerts' is not",
    ]
    for start in expected:
        assert sum(error.startswith(start) for error in errors) == 1, (start, errors)
    # The unset variable is reported once: not also as the empty secret it left behind.
    assert len(errors) == len(expected), errors


def test_a_source_type_rule_is_checked_while_another_key_is_wrong() -> None:
    text = GOOD.replace(
        "pipeline: p}", "pipeline: p, tolerance_seconds: 0, token: long-enough-token-value}", 1
    )
    with pytest.raises(ConfigError) as info:
        parse_config(text, env={"GH_SECRET": "config-test-secret"})
    assert sorted(info.value.errors) == [
        "sources.gh.token: not used by a 'github' source",
        "sources.gh.tolerance_seconds: Input should be greater than or equal to 1",
    ]


def test_yaml_error_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("sources:\n  gh: {type: github\npipelines: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    (error,) = info.value.errors
    assert re.match(rf"{re.escape(str(path))}:3:\d+: not valid YAML: ", error), error
    assert "\n" not in error

    result = CliRunner().invoke(cli, ["check-config", "--config", str(path)])
    assert result.exit_code == 2
    assert f"{path}:3:" in result.stderr


def test_check_config_prints_every_error_on_its_own_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(MANY_MISTAKES)
    result = CliRunner().invoke(cli, ["check-config", "--config", str(path)], env={})
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert "sources.github.secret: environment variable UNSET_GH_SECRET is not set" in lines
    assert "pipelines.triage.tools: unknown tool 'ghost'" in lines
    assert lines[-1] == f"{path}: invalid (9 errors)"
    assert len(lines) == 10, lines
    assert result.stdout == ""
    assert "long-enough-token-value" not in result.output


def test_an_unknown_model_is_a_warning_and_the_config_stays_valid(tmp_path: Path) -> None:
    path = tmp_path / "eventgate.yaml"
    path.write_text(
        GOOD.replace("model: claude-sonnet-4-6,", "model: claude-sonet-4, fallback_model: gpt-4o,")
    )
    result = CliRunner().invoke(
        cli, ["check-config", "--config", str(path)], env={"GH_SECRET": "config-test-secret"}
    )
    assert result.exit_code == 0, result.output
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("warning: pipelines.p.model: unknown model 'claude-sonet-4'")
    assert warnings[1].startswith("warning: pipelines.p.fallback_model: unknown model 'gpt-4o'")
    assert "p: model claude-sonet-4, fallback gpt-4o; tools alert" in result.stdout
    assert "warning" not in result.stdout


def test_a_model_priced_in_the_config_is_known(tmp_path: Path) -> None:
    path = tmp_path / "eventgate.yaml"
    priced = "models:\n  my-model: {price: {input: 1, output: 2, cache_write: 1, cache_read: 0}}\n"
    path.write_text(GOOD.replace("claude-sonnet-4-6", "my-model") + priced)
    result = CliRunner().invoke(
        cli, ["check-config", "--config", str(path)], env={"GH_SECRET": "config-test-secret"}
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
