"""Config of one webhook source (``sources.<name>`` in the YAML file).

Every ``type:`` reads only the keys it needs; a key set on a type that does not use it is an
error naming the key, so a typo or a copy-paste from another source never silently weakens
verification. Secrets may hold several values separated by spaces (the old and the new one
during a rotation); any of them verifies.

Every credential value (each space-separated secret or token, a basic-auth password, the
decoded key of a Standard Webhooks ``whsec_`` secret) has at least ``MIN_SECRET_LENGTH``
characters or bytes: an empty HMAC key verifies a signature anyone can compute, and a short
one can be guessed offline from a single signed request.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from app.config_rules import Problem, validate_with_rules, value_of

if TYPE_CHECKING:
    from app.sources.base import SourceKind

MIN_SECRET_LENGTH = 16

# Keys every source reads, whatever its type; each type module names the others it reads.
COMMON_KEYS = frozenset(
    {
        "type",
        "pipeline",
        "group_key",
        "max_body_bytes",
        "dedup_window_seconds",
        "tolerance_seconds",
        "filters",
        "collapse",
        "prompt_budget_chars",
    }
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BasicAuth(_Strict):
    username: str = Field(min_length=1)
    password: SecretStr

    @field_validator("password")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < MIN_SECRET_LENGTH:
            raise ValueError(f"must be at least {MIN_SECRET_LENGTH} characters")
        return value


class HmacScheme(_Strict):
    """A generic HMAC signature: ``prefix + encode(HMAC(secret, signed_payload))`` in ``header``.

    ``signed_payload`` is a template over ``{timestamp}`` and ``{body}``; it is used only when
    ``timestamp_header`` is set (otherwise the raw body alone is signed).
    """

    header: str | None = None
    algorithm: Literal["sha256", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: str = ""
    timestamp_header: str | None = None
    signed_payload: str | None = None

    @model_validator(mode="after")
    def _template(self) -> Self:
        if self.signed_payload is None:
            return self
        names = set(re.findall(r"\{([^{}]*)\}", self.signed_payload))
        if "body" not in names or names - {"body", "timestamp"}:
            raise ValueError("signed_payload may use only {timestamp} and {body}, and needs {body}")
        return self


class Condition(_Strict):
    """One test on a payload path; exactly one operator is set."""

    path: str = Field(min_length=1)
    equals: str | int | float | bool | None = None
    not_equals: str | int | float | bool | None = None
    in_: list[str | int | float | bool] | None = Field(default=None, alias="in")
    exists: bool | None = None
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _one_operator(self) -> Self:
        ops = self.model_fields_set - {"path"}
        if len(ops) != 1:
            names = "equals, not_equals, in, exists, gt, gte, lt, lte"
            raise ValueError(f"a condition on {self.path!r} needs exactly one of {names}")
        return self

    @property
    def operator(self) -> str:
        (op,) = self.model_fields_set - {"path"}
        return op


class FilterRules(_Strict):
    """Applied before the LLM: type globs first, then ``drop`` (any), then ``require`` (all)."""

    allow_types: list[str] | None = None
    deny_types: list[str] = Field(default_factory=list)
    require: list[Condition] = Field(default_factory=list)
    drop: list[Condition] = Field(default_factory=list)


class CollapseConfig(_Strict):
    """Repeats of a firing alert fingerprint within ``window_seconds`` only bump a counter.

    Alert sources (alertmanager, grafana) use each alert's ``fingerprint``; other types need
    ``fingerprint`` (a dotted path or a ``{template}`` over the payload).
    """

    window_seconds: int = Field(ge=1)
    fingerprint: str | None = None


class SourceConfig(_Strict):
    # One of the types in app/sources/registry.py.
    type: str
    pipeline: str
    secret: SecretStr | None = None
    token: SecretStr | None = None
    basic_auth: BasicAuth | None = None
    signature: HmacScheme | None = None
    # A dotted path or a "{a.b}/{c}" template; overrides the type's own group-key rule.
    group_key: str | None = None
    # github: group key per X-GitHub-Event (path or template), before the default rule.
    group_keys: dict[str, str] = Field(default_factory=dict)
    event_type: str | None = None
    split: bool = False
    delivery_id: str | None = None
    delivery_header: str | None = None
    topic_arns: list[str] = Field(default_factory=list)
    confirm_subscriptions: bool = False
    max_body_bytes: int | None = Field(default=None, ge=1)
    dedup_window_seconds: int | None = Field(default=None, ge=1)
    tolerance_seconds: int | None = Field(default=None, ge=1)
    filters: FilterRules | None = None
    collapse: CollapseConfig | None = None
    prompt_budget_chars: int | None = Field(default=None, ge=200)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        kinds = _kinds()
        if value not in kinds:
            raise ValueError(f"unknown source type {value!r}; one of {', '.join(kinds)}")
        return value

    @field_validator("secret", "token")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is None:
            return None
        values = value.get_secret_value().split()
        if not values:
            raise ValueError(
                f"is empty: set it to a value of at least {MIN_SECRET_LENGTH} characters"
            )
        decode = info.field_name == "secret" and info.data.get("type") == "standard-webhooks"
        for number, one in enumerate(values, start=1):
            which = f"value {number} of {len(values)}" if len(values) > 1 else "the value"
            if decode and one.startswith("whsec_"):
                size = len(_whsec_key(one, which))
                if size < MIN_SECRET_LENGTH:
                    raise ValueError(
                        f"the key of {which} decodes to {size} bytes; at least"
                        f" {MIN_SECRET_LENGTH} are needed"
                    )
            elif len(one) < MIN_SECRET_LENGTH:
                raise ValueError(
                    f"{which} has {len(one)} characters; at least {MIN_SECRET_LENGTH} are needed"
                )
        return value

    @model_validator(mode="wrap")
    @classmethod
    def _keys_for_type(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Self:
        source: Self = validate_with_rules(data, handler, rules=_type_rules, title=cls.__name__)
        return source

    def secrets(self) -> list[str]:
        return self.secret.get_secret_value().split() if self.secret else []

    def tokens(self) -> list[str]:
        return self.token.get_secret_value().split() if self.token else []


def _type_rules(data: dict[Any, Any], failed: frozenset[str]) -> list[Problem]:
    """What the source's ``type`` asks of its other keys, every problem at once."""
    kind = _kinds().get(data["type"]) if isinstance(data.get("type"), str) else None
    if kind is None or "type" in failed:
        return []  # the type's own error says it
    name = data["type"]
    used = COMMON_KEYS | kind.keys
    problems: list[Problem] = [
        ((key,), f"not used by a '{name}' source")
        for key in sorted(k for k in data if k in SourceConfig.model_fields and k not in used)
    ]
    if failed.isdisjoint(kind.needs) and not any(_present(data.get(k)) for k in kind.needs):
        problems.append(((), f"a '{name}' source needs {' or '.join(map(repr, kind.needs))}"))
    collapse = data.get("collapse")
    if (
        collapse
        and "collapse" not in failed
        and not kind.alert_fingerprints
        and not value_of(collapse, "fingerprint")
    ):
        problems.append((("collapse", "fingerprint"), f"needed for a '{name}' source"))
    return problems


def _whsec_key(secret: str, which: str) -> bytes:
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise ValueError(
            f"{which} is a whsec_ secret that is not valid base64 (whsec_ + the base64 of a"
            f" key of at least {MIN_SECRET_LENGTH} bytes)"
        ) from None


def _kinds() -> dict[str, SourceKind]:
    # Imported here, not at the top: the type modules build on SourceConfig.
    from app.sources.registry import KINDS

    return KINDS


def _present(value: object) -> bool:
    if isinstance(value, SecretStr):
        return value.get_secret_value() != ""
    return bool(value)
