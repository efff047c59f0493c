"""Credential-looking text: the rules, and ``may_hold_secret``, the one scan in front of them.

``redact_text`` replaces, in this order: PEM private keys (up to the END line, or to the end
of the text when a key was cut short); the password of a URL
(``https://user:[REDACTED:password]@host``, user and host kept); ``Cookie:`` lines;
``key=value`` / ``key: value`` assignments and ``--key value`` options whose key names a
secret (``app.redaction.assignments``); bearer tokens; ``Basic`` credentials (only when the base64
decodes to ``user:password``); JWTs; Anthropic, OpenAI, Slack and GitHub keys; AWS access key
ids; Standard Webhooks ``whsec_`` secrets; card numbers (``app.redaction.cards``). E-mail
addresses are not secrets and are kept.

Every rule takes time linear in the text, whatever the text: no two quantifiers of a rule can
take the same characters, a rule that could fail late starts only where a run of what it
repeats starts (``eyJ-eyJ-eyJ...`` is one start, not one per ``eyJ``), and what is repeated is
possessive (``*+``), scanned once. ``python -m bench.redaction`` holds each rule to that with
hostile shapes beside plain text of the same size.

``may_hold_secret`` is true wherever a rule above, or a key naming a secret, could apply, in
a text or in its JSON serialisation (escaped quotes, ``\\n`` for a line break). It is a
superset (tests hold it to that): a text it rejects has nothing to redact, so most payloads
cost one scan and no walk. The scan is one regex over the lower-cased text, run by the Rust
engine that pydantic-core (already a dependency) exposes: Python's ``re`` tries every branch
of such an alternation at every position, about 0.6 ms for an 8 KB GitHub payload here,
against some 14 µs (``python -m bench.redaction`` prints both).
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Callable
from typing import NamedTuple

from pydantic_core import SchemaValidator, core_schema

from app.redaction.assignments import redact_assignments, redact_options
from app.redaction.cards import redact_cards
from app.redaction.keys import name_pattern

# ASCII whitespace as it appears in a text or in its JSON serialisation (lower-cased).
_SCAN_WS = r"(?:[\t\n\x0b\x0c\r ]|\\[nrtfb]|\\u00[0-9a-f]{2})"
# The scan's regex, for lower-cased text (Rust syntax, which Python's ``re`` also reads).
SCAN_PATTERN = "|".join(
    (
        # A secret-named key or assignment, and a command-line option.
        rf"{name_pattern()}\\*[\"']?{_SCAN_WS}*[:=]|-[a-z0-9_.-]*{name_pattern()}{_SCAN_WS}",
        # What every credential rule's match starts with (lower-cased).
        "private key-----|bearer|basic|whsec_|eyj[a-z0-9_-]{8}|(?:akia|asia)[a-z0-9]{16}",
        r"(?:sk-|xox[abprs]-|gh[pousr]_|github_pat_)[a-z0-9_-]{10}",
        r"://[^\t\n\x0b\x0c\r /?#@:\"]*:[^\t\n\x0b\x0c\r /?#\"]+@",
        r"[2-6](?:[ -]?[0-9]){12,18}",
    )
)
# An unanchored search: ``pattern`` matches anywhere in the string.
_SCAN = SchemaValidator(core_schema.str_schema(pattern=SCAN_PATTERN, regex_engine="rust-regex"))


def may_hold_secret(text: str) -> bool:
    """False only when no rule of ``redact_text`` and no secret-named key can apply."""
    return _SCAN.isinstance_python(text.lower())


Replacement = Callable[[re.Match[str]], str]


class Rule(NamedTuple):
    """One pass of ``redact_text``. ``literal``: a substring every match contains (in lower
    case when ``case_blind``), checked first: a substring test costs a fraction of a pass."""

    literal: str | None
    case_blind: bool
    apply: Callable[[str], str]


def _replacing(pattern: re.Pattern[str], replacement: str | Replacement) -> Callable[[str], str]:
    return functools.partial(pattern.sub, replacement)


def _basic(match: re.Match[str]) -> str:
    token = match[2]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return match[0]
    if ":" not in decoded or not decoded.isprintable():
        return match[0]  # prose ("a basic question"), not user:password
    return f"{match[1]}[REDACTED:basic_auth]"


_PEM_END = r"-----END [A-Z ]*PRIVATE KEY-----"

# In the order ``redact_text`` applies them.
_RULES: list[Rule] = [
    Rule(
        # Up to the END line, or to the end of the text when it has none (a key cut short):
        # the body stops at nothing else, so no BEGIN is scanned twice.
        "private key-----",
        True,
        _replacing(
            re.compile(
                rf"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[^-]++|-(?!{_PEM_END[1:]}))*+"
                rf"(?:{_PEM_END})?",
                re.I | re.ASCII,
            ),
            "[REDACTED:private_key]",
        ),
    ),
    Rule(
        "://",
        True,
        _replacing(
            re.compile(
                r"(?i)((?<![a-z0-9+.-])[a-z][a-z0-9+.-]*+://[^\s/?#@:\"]*+:)[^\s/?#\"]+@",
                re.ASCII,
            ),
            r"\1[REDACTED:password]@",
        ),
    ),
    Rule(
        "cookie",
        True,
        _replacing(
            re.compile(
                r"(?i)(?<![A-Za-z0-9_.-])((?:set-)?cookies?\\*[\"']?[ \t]*+[:=][ \t]*+\\*[\"']?)"
                r"[^\r\n\"\\]+",
                re.ASCII,
            ),
            r"\1[REDACTED:cookie]",
        ),
    ),
    Rule(None, False, redact_assignments),
    Rule("-", False, redact_options),
    Rule(
        "bearer",
        True,
        _replacing(
            re.compile(r"(?i)\bbearer\s++[A-Za-z0-9._~+/=-]{8,}", re.ASCII), "[REDACTED:bearer]"
        ),
    ),
    Rule(
        "basic",
        True,
        _replacing(
            re.compile(r"(?i)\b(basic\s++)([A-Za-z0-9+/]{6,}+={0,2}+)(?![A-Za-z0-9+/=])", re.ASCII),
            _basic,
        ),
    ),
    Rule(
        # Only where a run of base64url characters starts: "eyJ-eyJ-eyJ..." is one start.
        "eyJ",
        False,
        _replacing(
            re.compile(
                r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}+\.[A-Za-z0-9_-]{8,}",
                re.ASCII,
            ),
            "[REDACTED:jwt]",
        ),
    ),
    Rule(
        None,
        False,
        _replacing(
            re.compile(
                r"\b(?:sk-ant-|sk-|xox[abprs]-|gh[pousr]_|github_pat_)[A-Za-z0-9_-]{10,}",
                re.ASCII,
            ),
            "[REDACTED:api_key]",
        ),
    ),
    Rule(
        "IA",
        False,
        _replacing(re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b", re.ASCII), "[REDACTED:aws_key]"),
    ),
    Rule(
        "whsec_",
        False,
        _replacing(re.compile(r"\bwhsec_[A-Za-z0-9+/=]{10,}", re.ASCII), "[REDACTED:whsec]"),
    ),
    Rule(
        None,
        False,
        _replacing(
            # A run of digit groups with 13 digits or more, not after "0." (the digits of a
            # fraction are not a card) nor touching a letter (a last group that does is left
            # out, and ``redact_cards`` counts again). The first digit comes first, so the
            # engine skips to digits; each group is taken once.
            re.compile(
                r"[0-9](?<![0-9A-Za-z][0-9])(?<![0-9]\.[0-9])(?=(?:[ -]?[0-9]){12})"
                r"[0-9]*+(?:[ -][0-9]++(?=[ -]|(?![0-9A-Za-z])))*+(?![0-9A-Za-z])",
                re.ASCII,
            ),
            lambda match: redact_cards(match[0]),
        ),
    ),
]


def redact_text(text: str) -> str:
    """``text`` with every credential-looking part replaced by ``[REDACTED:<kind>]``."""
    if not may_hold_secret(text):
        return text
    # Taken once: a replacement ("[REDACTED:...]") cannot create a literal checked later.
    lowered = text.lower()
    for rule in _RULES:
        if rule.literal is not None and rule.literal not in (lowered if rule.case_blind else text):
            continue
        text = rule.apply(text)
    return text


def rules() -> list[Rule]:
    """The rules in the order ``redact_text`` applies them (for tests of the literal checks)."""
    return list(_RULES)
