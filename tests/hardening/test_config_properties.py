"""Property: any mutation of a valid config file — a key deleted, a value replaced by any
YAML value, an unknown key added — either still parses or raises ``ConfigError`` whose
every message starts with the path of a key in the file; never another exception."""

from __future__ import annotations

import copy
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config import ConfigError, GatewayConfig, builtin_config_text, parse_config

RICH = """
sources:
  github:
    type: github
    secret: rich-config-secret-1 rich-config-secret-2
    pipeline: triage
    group_keys: {push: repository.full_name}
  alerts:
    type: alertmanager
    token: rich-config-token-value
    pipeline: triage
    collapse: {window_seconds: 60}
    filters:
      deny_types: ["*.resolved"]
      drop: [{path: status, equals: resolved}]
      require: [{path: alerts.0.labels.severity, in: [critical, high]}]
  hook:
    type: hmac
    secret: rich-config-hmac-secret
    pipeline: triage
    split: true
    group_key: "{device.site}/{device.id}"
    signature: {header: X-Sig, algorithm: sha512, encoding: base64, prefix: "v1=",
                timestamp_header: X-Ts, signed_payload: "{timestamp}:{body}"}
  sns: {type: aws-sns, topic_arns: ["arn:aws:sns:us-east-1:123456789012:t"], pipeline: triage}
pipelines:
  triage: {model: m, fallback_model: f, system: s, tools: [alert], max_tokens: 100}
tools:
  alert:
    description: d
    input_schema:
      type: object
      properties: {title: {type: string, pattern: "^[a-z]+$"}, message_group_id: {type: string}}
    topic_arn: arn:aws:sns:us-east-1:123456789012:alerts.fifo
    group_id: llm
"""
BASES = [yaml.safe_load(RICH), yaml.safe_load(builtin_config_text())]
ENV = {"GITHUB_WEBHOOK_SECRET": "property-test-github-secret"}

yaml_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["${UNSET_VAR}", "${X:-}", "{", "[", "arn:aws:sns:x", "*", "0"])
)
yaml_values = st.recursive(
    yaml_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += paths(value, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[Any, ...]]:
    config = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 3))):
        options = paths(config)
        if not options:
            break
        path = draw(st.sampled_from(options))
        parent = config
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["delete", "replace", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(yaml_values)
        elif isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(st.text(min_size=1, max_size=8))] = draw(yaml_values)
        else:
            parent[path[-1]] = draw(yaml_values)
    return config, path


def _names_a_key(error: str, config: dict[str, Any]) -> bool:
    head = error.split(":", 1)[0].split(".", 1)[0].split("[", 1)[0]
    return head in {str(k) for k in config} | {"sources", "pipelines", "tools"}


@settings(max_examples=400, deadline=None)
@given(case=mutated())
def test_any_mutation_parses_or_names_the_key(case: tuple[dict[str, Any], tuple[Any, ...]]) -> None:
    config, _ = case
    text = yaml.safe_dump(config, allow_unicode=True)
    errors: list[str] = []
    try:
        parsed = parse_config(text, env=ENV)
    except ConfigError as exc:
        errors = exc.errors or ["(ConfigError without messages)"]
    else:
        assert isinstance(parsed, GatewayConfig)
    for error in errors:
        assert ": " in error, error
        assert _names_a_key(error, config), error
