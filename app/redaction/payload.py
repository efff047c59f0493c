"""The structural walk over a JSON payload.

Every dict key is judged by ``secret_kind`` (its value, whatever its type, becomes
``"[REDACTED:<kind>]"``) and by the text rules (a key that is itself a credential is
renamed), every string by the text rules, and a string holding a JSON object
or array is parsed, walked, and serialised back only when something in it was redacted (so
``"{\\"password\\": \\"x\\"}"`` is caught, at any number of levels, and untouched JSON text keeps
its spacing). Numbers are redacted only by their key, since 18-19 digit ids are common: a
number under a secret key, and a card number (issuer prefix, Luhn sum) whose key or whose
container's key names a card (``{"card": {"number": 4111...}}``).

Invariants:
- The input is never changed; the result is a new value (or the input itself, from
  ``redact_to_json``, when nothing needed redacting).
- A document (the payload, or JSON held in one of its strings) nested deeper than
  ``MAX_DEPTH`` levels raises ``NestingTooDeep``; the walk keeps its own stack, so Python's
  recursion limit is never reached (JSON in strings recurses once per level of escaping,
  and each level is at least one level deeper).
- ``redact_to_json`` walks only when ``may_hold_secret`` accepts the serialised payload, and
  the JSON it returns is that of the payload it returns.
"""

from __future__ import annotations

from typing import Any

import orjson

from app.redaction.cards import is_card_number
from app.redaction.keys import names_card, secret_kind
from app.redaction.text import may_hold_secret, redact_text

# orjson serialises up to 254 levels of nesting; the walk refuses what it could not write back.
MAX_DEPTH = 254
# No rule matches fewer characters ("pwd=x").
_SHORTEST_MATCH = 5
_SMALLEST_CARD = 10**12  # 13 digits
# Keys the text rules leave alone, up to _REMEMBERED_KEY_CHARS long; emptied when full, so a
# sender making up keys cannot grow it. Keys that hold a secret are never remembered.
_PLAIN_KEYS: set[str] = set()
_REMEMBERED_KEYS = 4096
_REMEMBERED_KEY_CHARS = 80


class NestingTooDeep(ValueError):
    def __init__(self) -> None:
        super().__init__(f"JSON is nested deeper than {MAX_DEPTH} levels")


def payload_to_json(payload: Any) -> bytes:
    """The payload's JSON; ``NestingTooDeep`` past ``MAX_DEPTH`` levels."""
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError as exc:
        # orjson says so only in the message; any other encoding error is not ours to rename.
        if "recursion limit" in str(exc).lower():
            raise NestingTooDeep from None
        raise


def redact_payload(payload: Any) -> Any:
    """A redacted copy of ``payload``, always walked (no pre-check)."""
    redacted, _ = _redact_value(orjson.loads(payload_to_json(payload)))
    return redacted


def redact_to_json(payload: Any) -> tuple[Any, bytes]:
    """The redacted payload and its JSON, walking only when the JSON may hold a secret."""
    data = payload_to_json(payload)
    if not may_hold_secret(data.decode()):
        return payload, data
    redacted, changed = _redact_value(orjson.loads(data))
    if not changed:
        return payload, data
    return redacted, orjson.dumps(redacted)


def _redact_value(value: Any) -> tuple[Any, bool]:
    """``value`` redacted (containers in place) and whether anything changed."""
    if isinstance(value, dict | list):
        return value, _walk(value)
    if isinstance(value, str):
        redacted = _redact_string(value)
        return redacted, redacted is not value
    return value, False


def _walk(root: dict[str, Any] | list[Any], *, escapes: int = 0) -> bool:
    """Redact ``root`` in place, level by level; True when anything was replaced.

    ``escapes`` counts the JSON documents held in strings around ``root``."""
    changed = False
    # (container, its depth, the key it sits under)
    stack: list[tuple[dict[str, Any] | list[Any], int, object]] = [(root, 1, None)]
    # Assigning to an existing key or index while iterating is safe: sizes stay the same.
    while stack:
        node, depth, under = stack.pop()
        entries = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in entries:
            if type(key) is str and (kind := secret_kind(key)) is not None:
                redacted: Any = f"[REDACTED:{kind}]"
            elif isinstance(value, str):
                redacted = _redact_string(value, escapes=escapes)
                if redacted is value:
                    continue
            elif type(value) is int and _card_number_under_card(value, key, under):
                redacted = "[REDACTED:card]"
            else:
                if isinstance(value, dict | list):
                    if depth >= MAX_DEPTH:
                        raise NestingTooDeep
                    if value:
                        stack.append((value, depth + 1, key))
                continue
            node[key] = redacted  # type: ignore[index]
            changed = True
        if isinstance(node, dict) and _redact_keys(node):
            changed = True
    return changed


def _redact_keys(node: dict[str, Any]) -> bool:
    """Keys that look like credentials (a map keyed by token, a header line as a key) renamed
    by the text rules, in place and in order; True when one was. Keys that become the same
    name are told apart by a number: ``[REDACTED:api_key]``, ``[REDACTED:api_key] (2)``."""
    renamed = {key: new for key in node if (new := _redacted_key(key)) is not key}
    if not renamed:
        return False
    entries = list(node.items())
    node.clear()
    taken = {key for key, _ in entries if key not in renamed}
    for key, value in entries:
        name = key
        if (redacted := renamed.get(key)) is not None:
            name, n = redacted, 2
            while name in taken:
                name, n = f"{redacted} ({n})", n + 1
            taken.add(name)
        node[name] = value
    return True


def _redacted_key(key: str) -> str:
    """``key`` after the text rules: the same object when none applies (known keys are
    remembered, so a payload's keys cost a set lookup each)."""
    if key in _PLAIN_KEYS or len(key) < _SHORTEST_MATCH:
        return key
    redacted = redact_text(key)
    if redacted is key and len(key) <= _REMEMBERED_KEY_CHARS:
        if len(_PLAIN_KEYS) >= _REMEMBERED_KEYS:
            _PLAIN_KEYS.clear()
        _PLAIN_KEYS.add(key)
    return redacted


def _card_number_under_card(value: int, key: object, under: object) -> bool:
    """A card number whose key, or the key of the object or array holding it, names a card:
    ``{"card": 4111...}``, ``{"card": {"number": 4111...}}``, ``{"cards": [4111...]}``."""
    return (
        value >= _SMALLEST_CARD
        and is_card_number(str(value))
        and any(type(name) is str and names_card(name) for name in (key, under))
    )


def _redact_string(text: str, *, escapes: int = 0) -> str:
    """The same object when nothing in ``text`` needs redacting.

    A string holding a JSON object, array or string (JSON encoded twice) is redacted as JSON.
    Each level of escaping at least doubles the backslashes, so real payloads stay a few
    levels deep; ``MAX_DEPTH`` bounds the recursion all the same."""
    if len(text) < _SHORTEST_MATCH or not may_hold_secret(text):
        return text
    if text.lstrip()[:1] in ("{", "[", '"'):
        try:
            inner = orjson.loads(text)
        except orjson.JSONDecodeError:
            inner = None  # not JSON after all: the text rules apply
        if isinstance(inner, dict | list | str):
            if escapes >= MAX_DEPTH:
                raise NestingTooDeep
            if isinstance(inner, str):
                redacted = _redact_string(inner, escapes=escapes + 1)
                return text if redacted is inner else orjson.dumps(redacted).decode()
            changed = _walk(inner, escapes=escapes + 1)
            return orjson.dumps(inner).decode() if changed else text
    return redact_text(text)
