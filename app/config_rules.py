"""Rules across the keys of one config block, reported together with its field errors.

pydantic runs a model's ``after`` validators only once every field is valid, so a rule such
as "a github source needs a secret" stayed silent while another key of the same source was
wrong, and ``check-config`` needed one run per mistake. A block that checks such rules does
it in a ``wrap`` validator through ``validate_with_rules``: the rules read the block's raw
mapping, are told which keys failed already (so a bad value is not reported twice), and each
problem is one error line with its own location, next to the field errors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError, ValidatorFunctionWrapHandler
from pydantic_core import InitErrorDetails, PydanticCustomError

# (location inside the block, message): ``(("pipeline",), "unknown pipeline 'x'")``.
Problem = tuple[tuple[str | int, ...], str]
Rules = Callable[[dict[Any, Any], frozenset[str]], list[Problem]]


def validate_with_rules(
    data: Any, handler: ValidatorFunctionWrapHandler, *, rules: Rules, title: str
) -> Any:
    """``handler(data)``, raising its field errors and the ``rules``' problems together."""
    failed: ValidationError | None = None
    try:
        validated = handler(data)
    except ValidationError as exc:
        failed = exc
    # A block given as a model instance was checked when it was built.
    problems = rules(data, _failed_keys(failed)) if isinstance(data, dict) else []
    if not problems:
        if failed is not None:
            raise failed
        return validated
    errors = [_again(error) for error in failed.errors()] if failed is not None else []
    errors += [
        InitErrorDetails(type=PydanticCustomError("config_rule", message), loc=location, input=data)
        for location, message in problems
    ]
    raise ValidationError.from_exception_data(title, errors)


def value_of(block: Any, key: str) -> Any:
    """A key of a block given either as its raw mapping or as a built model."""
    if isinstance(block, dict):
        return block.get(key)
    return getattr(block, key, None)


def _failed_keys(exc: ValidationError | None) -> frozenset[str]:
    if exc is None:
        return frozenset()
    return frozenset(str(error["loc"][0]) for error in exc.errors() if error["loc"])


def _again(error: Any) -> InitErrorDetails:
    # The message as pydantic rendered it (``Value error, ...`` included), at its location.
    return InitErrorDetails(
        type=PydanticCustomError(error["type"], error["msg"]),
        loc=tuple(error["loc"]),
        input=error["input"],
    )
