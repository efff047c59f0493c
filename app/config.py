"""The YAML config file: sources, pipelines and tools.

``${VAR}`` and ``${VAR:-default}`` are interpolated from the environment in string values
before validation. Every error names the key it is about (``sources.github.secret: ...``).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from croniter import croniter
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from app.config_rules import Problem, validate_with_rules, value_of
from app.config_yaml import UnsafeYaml, read_yaml
from app.declared_keys import Unfilterable, check_readable
from app.events import WINDOW_SOURCE
from app.source_config import SourceConfig

__all__ = ["ConfigError", "GatewayConfig", "SourceConfig", "load_config"]

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,251}\.fifo$")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConfigError(Exception):
    """The config file cannot be used; ``errors`` lists one message per bad key."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid config:\n" + "\n".join(f"  - {e}" for e in errors))
        self.errors = errors


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetConfig(_Strict):
    """A pipeline's daily spend (UTC day), counted in Redis across processes."""

    daily_tokens: int | None = Field(default=None, ge=1)
    daily_cost_usd: float | None = Field(default=None, gt=0)
    # wait: events stay queued until the next UTC day; dead_letter: they are dead-lettered.
    on_exhausted: Literal["wait", "dead_letter"] = "wait"

    @model_validator(mode="after")
    def _some_limit(self) -> BudgetConfig:
        if self.daily_tokens is None and self.daily_cost_usd is None:
            raise ValueError("a budget needs 'daily_tokens' or 'daily_cost_usd'")
        return self


class ShadowConfig(_Strict):
    """A candidate that also decides a share of this pipeline's live events, publishing
    nothing (``app/evaluate/shadow.py``)."""

    pipeline: str
    # Share of the live events it sees, chosen by event id (the same events on every process).
    sample: float = Field(default=1.0, ge=0.0, le=1.0)


class HistoryConfig(_Strict):
    """The key's last ``events`` events and their decisions in the prompt (``app/decide/
    history.py``), within ``max_chars``."""

    events: int = Field(ge=1, le=50)
    max_chars: int = Field(default=2_000, ge=200, le=20_000)


class CacheConfig(_Strict):
    """Reuse the decision for a prompt already paid for (``app/decide/cache.py``)."""

    ttl_seconds: int = Field(ge=1, le=30 * 86400)


class EscalateConfig(_Strict):
    """Triage: when this pipeline's decision calls ``when_tool``, the event is decided again
    by pipeline ``to``, and only that decision is stored and published."""

    to: str
    when_tool: str


class WindowConfig(_Strict):
    """Decide a key's events together (``app/decide/windows.py``): a window opens with the
    key's first event and closes ``seconds`` later or at its ``max_events``-th event."""

    seconds: float = Field(gt=0, le=86_400)
    max_events: int = Field(default=100, ge=1, le=1_000)


class BatchLaneConfig(_Strict):
    """How a ``mode: batch`` pipeline groups its requests (``app/decide/batch_lane.py``): a
    batch is sent once ``max_requests`` wait or the oldest has waited ``wait_seconds``."""

    wait_seconds: float = Field(default=60, ge=0, le=86_400)
    max_requests: int = Field(default=1_000, ge=1, le=10_000)
    # How often the lane asks whether a sent batch has ended.
    poll_seconds: float = Field(default=30, gt=0, le=3_600)


class DigestOver(_Strict):
    """What a scheduled pipeline's digest covers: the stored events of the last ``hours``
    (of ``source``, or every source), at most ``max_events`` of them listed."""

    source: str | None = None
    hours: float = Field(gt=0, le=31 * 24)
    max_events: int = Field(default=200, ge=1, le=5_000)


class PipelineConfig(_Strict):
    model: str
    fallback_model: str | None = None
    system: str
    tools: list[str] = Field(min_length=1)
    max_tokens: int = Field(default=1024, ge=1)
    provider: Literal["anthropic", "bedrock"] = "anthropic"
    # In-flight Claude calls of this pipeline in one process (the process limit still applies).
    max_concurrency: int | None = Field(default=None, ge=1)
    # Tool calls one reply may make; calls beyond it are refused and recorded, not published.
    max_tool_calls: int = Field(default=5, ge=1, le=100)
    budget: BudgetConfig | None = None
    shadow: list[ShadowConfig] = Field(default_factory=list, max_length=10)
    history: HistoryConfig | None = None
    escalate: EscalateConfig | None = None
    cache: CacheConfig | None = None
    window: WindowConfig | None = None
    # ``batch``: decided through the Message Batches API (half the price, within 24 hours).
    mode: Literal["live", "batch"] = "live"
    batch: BatchLaneConfig | None = None
    # A scheduled digest (``app/schedule/digests.py``): cron, UTC; 5 fields, or 6 with seconds.
    schedule: str | None = None
    over: DigestOver | None = None

    @model_validator(mode="after")
    def _digest(self) -> PipelineConfig:
        if (self.schedule is None) != (self.over is None):
            raise ValueError("a digest needs both 'schedule' (cron) and 'over'")
        if self.schedule is not None and not croniter.is_valid(self.schedule):
            raise ValueError(f"schedule {self.schedule!r} is not a cron expression")
        if self.schedule is not None and self.window is not None:
            raise ValueError("a scheduled digest is one event per tick: it takes no 'window'")
        if self.mode == "batch" and self.provider != "anthropic":
            raise ValueError("mode 'batch' needs provider 'anthropic' (Bedrock has no batches)")
        if self.mode == "batch" and self.escalate is not None:
            raise ValueError("a 'mode: batch' pipeline cannot escalate (one call per event)")
        if self.batch is not None and self.mode != "batch":
            raise ValueError("'batch' settings need 'mode: batch'")
        return self


class PriceConfig(_Strict):
    """USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write: float = Field(ge=0)
    cache_read: float = Field(ge=0)


class ModelConfig(_Strict):
    """Per-model limits shared by every process (0 = no local limit) and prices."""

    requests_per_minute: int | None = Field(default=None, ge=0)
    input_tokens_per_minute: int | None = Field(default=None, ge=0)
    output_tokens_per_minute: int | None = Field(default=None, ge=0)
    price: PriceConfig | None = None


class ToolConfig(_Strict):
    description: str
    input_schema: dict[str, Any]
    topic_arn: str | None = None
    # Where the SNS MessageGroupId comes from: the event's group key, or the tool's
    # `message_group_id` argument when it is a valid SNS id (else the event's key).
    group_id: Literal["event", "llm"] = "event"

    @model_validator(mode="after")
    def _llm_group_id(self) -> ToolConfig:
        if self.group_id == "llm" and "message_group_id" not in self.input_schema.get(
            "properties", {}
        ):
            raise ValueError("group_id: llm needs a 'message_group_id' property in input_schema")
        return self

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object":
            raise ValueError("input_schema must have type: object")
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON schema: {exc.message}") from exc
        try:
            check_readable(value)
        except Unfilterable as exc:
            # Every call of the tool would be refused: its undeclared keys cannot be told apart.
            raise ValueError(f"undeclared input keys could not be filtered out: {exc}") from exc
        return value

    @field_validator("topic_arn")
    @classmethod
    def _arn(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not _TOPIC_ARN.match(value):
            raise ValueError(f"{value!r} is not an SNS FIFO topic ARN (arn:aws:sns:...:name.fifo)")
        return value


class GatewayConfig(_Strict):
    sources: dict[str, SourceConfig] = Field(min_length=1)
    pipelines: dict[str, PipelineConfig] = Field(min_length=1)
    tools: dict[str, ToolConfig] = Field(min_length=1)
    models: dict[str, ModelConfig] = Field(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _references(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> GatewayConfig:
        config: GatewayConfig = validate_with_rules(
            data, handler, rules=_reference_rules, title=cls.__name__
        )
        return config


def _reference_rules(data: dict[Any, Any], failed: frozenset[str]) -> list[Problem]:
    """Names, and what the sections name of each other (checked whatever else is wrong)."""
    sections = {
        kind: data[kind]
        for kind in ("sources", "pipelines", "tools")
        if isinstance(data.get(kind), dict)
    }
    problems: list[Problem] = [
        ((kind, str(name)), "name must match [A-Za-z0-9_-]{1,64}")
        for kind, blocks in sections.items()
        for name in blocks
        if not _NAME.match(str(name))
    ]
    if WINDOW_SOURCE in sections.get("sources", {}):
        # The processor takes such events for closed windows, whose payload names the window.
        problems.append((("sources", WINDOW_SOURCE), f"{WINDOW_SOURCE!r} is a reserved name"))
    pipelines, tools = sections.get("pipelines"), sections.get("tools")
    for name, source in sections.get("sources", {}).items():
        pipeline = value_of(source, "pipeline")
        if pipelines is not None and isinstance(pipeline, str) and pipeline not in pipelines:
            problems.append((("sources", str(name), "pipeline"), f"unknown pipeline {pipeline!r}"))
    for name, pipeline in (pipelines or {}).items():
        offered = value_of(pipeline, "tools")
        if tools is None or not isinstance(offered, list):
            continue
        problems += [
            (("pipelines", str(name), "tools"), f"unknown tool {tool!r}")
            for tool in offered
            if isinstance(tool, str) and tool not in tools
        ]
    for name, pipeline in (pipelines or {}).items():
        shadows = value_of(pipeline, "shadow")
        for index, shadow in enumerate(shadows if isinstance(shadows, list) else []):
            candidate = value_of(shadow, "pipeline")
            where = ("pipelines", str(name), "shadow", str(index), "pipeline")
            if isinstance(candidate, str) and candidate not in (pipelines or {}):
                problems.append((where, f"unknown pipeline {candidate!r}"))
            elif candidate == name:
                problems.append((where, "a pipeline cannot shadow itself"))
    for name, pipeline in (pipelines or {}).items():
        problems += _escalation_rules(str(name), pipeline, pipelines or {})
        over = value_of(pipeline, "over")
        source = value_of(over, "source") if over is not None else None
        if isinstance(source, str) and source not in sections.get("sources", {}):
            problems.append(
                (("pipelines", str(name), "over", "source"), f"unknown source {source!r}")
            )
    return problems


def _escalation_rules(name: str, pipeline: Any, pipelines: dict[Any, Any]) -> list[Problem]:
    escalate = value_of(pipeline, "escalate")
    if escalate is None:
        return []
    target, tool = value_of(escalate, "to"), value_of(escalate, "when_tool")
    where = ("pipelines", name, "escalate")
    if isinstance(target, str) and target not in pipelines:
        return [((*where, "to"), f"unknown pipeline {target!r}")]
    if target == name:
        return [((*where, "to"), "a pipeline cannot escalate to itself")]
    if isinstance(target, str) and value_of(pipelines[target], "escalate") is not None:
        return [((*where, "to"), f"pipeline {target!r} escalates too: one step only")]
    if isinstance(target, str) and value_of(pipelines[target], "mode") == "batch":
        return [((*where, "to"), f"pipeline {target!r} is 'mode: batch': escalations are live")]
    offered = value_of(pipeline, "tools")
    if isinstance(tool, str) and isinstance(offered, list) and tool not in offered:
        return [((*where, "when_tool"), f"{tool!r} is not one of this pipeline's tools")]
    return []


def _interpolate(
    node: Any, loc: tuple[str, ...], env: dict[str, str], unset: UnsetVariables
) -> Any:
    if isinstance(node, dict):
        return {k: _interpolate(v, (*loc, str(k)), env, unset) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, (*loc, str(i)), env, unset) for i, v in enumerate(node)]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        unset.setdefault(loc, []).append(name)
        return ""

    return _ENV_REF.sub(substitute, node)


# Where a ``${VAR}`` without a default named a variable that is not set, and which.
UnsetVariables = dict[tuple[str, ...], list[str]]


def parse_config(
    text: str, *, env: dict[str, str] | None = None, origin: str = "config"
) -> GatewayConfig:
    """Every error of the file at once, each naming its key (or, for YAML syntax, ``origin``
    with the line and column). A key whose variable is not set reports that, not also the
    empty value it was validated with."""
    try:
        raw = read_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_error(exc, origin)]) from None
    except UnsafeYaml as exc:
        raise ConfigError([f"{origin}: refused: {exc}"]) from None
    if not isinstance(raw, dict):
        raise ConfigError(["the config must be a mapping with sources, pipelines and tools"])
    unset: UnsetVariables = {}
    data = _interpolate(raw, (), dict(os.environ) if env is None else env, unset)
    errors = [
        f"{_path(loc)}: environment variable {name} is not set"
        for loc, names in unset.items()
        for name in names
    ]
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        errors += [_describe(e) for e in exc.errors() if _location(e) not in unset]
    else:
        if not errors:
            return config
    raise ConfigError(errors)


def _yaml_error(exc: yaml.YAMLError, origin: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    where = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark is not None else origin
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"{where}: not valid YAML: {f'{context}: ' if context else ''}{problem}"


def _location(error: Any) -> tuple[str, ...]:
    return tuple(str(p) for p in error["loc"] if not str(p).startswith("function-"))


def _path(loc: tuple[str, ...]) -> str:
    return "".join(
        f"[{p}]" if p.isdigit() and i else f"{'.' if i else ''}{p}" for i, p in enumerate(loc)
    )


def _describe(error: Any) -> str:
    loc = ".".join(_location(error))
    msg = str(error["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def builtin_config_text() -> str:
    return resources.files("app").joinpath("example_config.yaml").read_text()


def load_config(path: Path | None, *, env: dict[str, str] | None = None) -> GatewayConfig:
    """Load ``path``, or the built-in example config when ``path`` is None."""
    if path is None:
        return parse_config(builtin_config_text(), env=env, origin="built-in example config")
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError([f"cannot read {path}: {exc.strerror}"]) from exc
    return parse_config(text, env=env, origin=str(path))
