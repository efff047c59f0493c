"""Credential-looking text: the rules, and ``may_hold_secret``, the one scan in front of them.

``redact_text`` replaces, in this order: PEM private keys; the password of a URL
(``https://user:[REDACTED:password]@host``, user and host kept); ``Cookie:`` lines;
``key=value`` / ``key: value`` assignments whose key names a secret (the rule of
``app.redaction.keys``: form bodies, query strings, headers, log lines, JSON text with escaped
quotes); bearer tokens; ``Basic`` credentials (only when the base64 decodes to
``user:password``); JWTs; Anthropic, OpenAI, Slack and GitHub keys; AWS access key ids;
Standard Webhooks ``whsec_`` secrets; card numbers (13-19 digits, spaces or dashes allowed,
a known issuer prefix and a valid Luhn sum). E-mail addresses are not secrets and are kept.

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
import re
from collections.abc import Callable

from pydantic_core import SchemaValidator, core_schema

from app.redaction.keys import name_pattern, secret_kind

# ASCII whitespace as it appears in a text or in its JSON serialisation (lower-cased).
_SCAN_WS = r"(?:[\t\n\x0b\x0c\r ]|\\[nrtfb]|\\u00[0-9a-f]{2})"
# The scan's regex, for lower-cased text (Rust syntax, which Python's ``re`` also reads).
SCAN_PATTERN = "|".join(
    (
        # A secret-named key or assignment.
        rf"{name_pattern(case_blind=False)}\\*[\"']?{_SCAN_WS}*[:=]",
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


_NAME = name_pattern()

Replacement = Callable[[re.Match[str]], str]


def _assignment(match: re.Match[str]) -> str:
    kind = secret_kind(match["key"])
    if kind is None:
        return match[0]
    return f"{match['key']}{match['sep']}[REDACTED:{kind}]"


def _basic(match: re.Match[str]) -> str:
    token = match[2]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return match[0]
    if ":" not in decoded or not decoded.isprintable():
        return match[0]  # prose ("a basic question"), not user:password
    return f"{match[1]}[REDACTED:basic_auth]"


def _issuer(digits: str) -> bool:
    """Visa, Mastercard, American Express, Discover, Diners Club, JCB, UnionPay, Maestro, Mir."""
    two, three, four = int(digits[:2]), int(digits[:3]), int(digits[:4])
    return (
        digits[0] in "46"
        or 50 <= two <= 58
        or two in (34, 36, 37, 38, 39)
        or 300 <= three <= 305
        or 3528 <= four <= 3589
        or 2200 <= four <= 2204
        or 2221 <= four <= 2720
    )


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        n = int(char) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _is_card(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and _issuer(digits) and _luhn(digits)


def _cards(match: re.Match[str]) -> str:
    """A run of digit groups: the longest card in it from each group on is redacted, so a
    number written next to a card ("4111 1111 1111 1111 2 items") does not hide it."""
    parts = re.split("([ -])", match[0])  # digits, separator, digits, ...
    groups = parts[::2]
    out: list[str] = []
    i = 0
    while i < len(groups):
        end = None
        digits = ""
        for j in range(i, len(groups)):
            digits += groups[j]
            if len(digits) > 19:
                break
            if _is_card(digits):
                end = j
        if end is None:
            out.append(groups[i])
            if i + 1 < len(groups):
                out.append(parts[2 * i + 1])
            i += 1
            continue
        out.append("[REDACTED:card]")
        if end + 1 < len(groups):
            out.append(parts[2 * end + 1])
        i = end + 1
    return "".join(out)


# (literal that every match contains, in lower case when the pattern is case-blind; pattern;
# replacement). The literal is checked first: a substring test costs a fraction of a pass.
_RULES: list[tuple[str | None, re.Pattern[str], str | Replacement]] = [
    (
        "private key-----",
        re.compile(
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",
            re.S | re.I | re.ASCII,
        ),
        "[REDACTED:private_key]",
    ),
    (
        "://",
        re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/?#@:\"]*:)[^\s/?#\"]+@", re.ASCII),
        r"\1[REDACTED:password]@",
    ),
    (
        "cookie",
        re.compile(
            r"(?i)(?<![A-Za-z0-9_.-])((?:set-)?cookies?\\*[\"']?[ \t]*[:=][ \t]*\\*[\"']?)"
            r"[^\r\n\"\\]+",
            re.ASCII,
        ),
        r"\1[REDACTED:cookie]",
    ),
    (
        None,
        re.compile(
            rf"(?<![A-Za-z0-9_.-])(?P<key>(?:[A-Za-z][A-Za-z0-9_.-]*?)?{_NAME})"
            r"(?P<sep>\\*[\"']?[ \t]*[:=][ \t]*\\*[\"']?)"
            r"(?P<value>(?<=[\"'])[^\"'\\\r\n]+"
            r"|(?i:(?:bearer|basic|token|digest|negotiate)[ \t]+)?[^\s&\"',;{}()<>\[\]\\]+)",
            re.ASCII,
        ),
        _assignment,
    ),
    (
        "bearer",
        re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{8,}", re.ASCII),
        "[REDACTED:bearer]",
    ),
    (
        "basic",
        re.compile(r"(?i)\b(basic\s+)([A-Za-z0-9+/]{6,}={0,2})(?![A-Za-z0-9+/=])", re.ASCII),
        _basic,
    ),
    (
        "eyJ",
        re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", re.ASCII),
        "[REDACTED:jwt]",
    ),
    (
        None,
        re.compile(
            r"\b(?:sk-ant-|sk-|xox[abprs]-|gh[pousr]_|github_pat_)[A-Za-z0-9_-]{10,}", re.ASCII
        ),
        "[REDACTED:api_key]",
    ),
    ("IA", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b", re.ASCII), "[REDACTED:aws_key]"),
    ("whsec_", re.compile(r"\bwhsec_[A-Za-z0-9+/=]{10,}", re.ASCII), "[REDACTED:whsec]"),
    (
        None,
        # Not after "0." either: the digits of a fraction are not a card.
        re.compile(
            r"(?<![0-9A-Za-z])(?<![0-9]\.)[0-9](?:[ -]?[0-9]){12,}(?![0-9A-Za-z])", re.ASCII
        ),
        _cards,
    ),
]


def redact_text(text: str) -> str:
    """``text`` with every credential-looking part replaced by ``[REDACTED:<kind>]``."""
    if not may_hold_secret(text):
        return text
    # Taken once: a replacement ("[REDACTED:...]") cannot create a literal checked later.
    lowered = text.lower()
    for literal, pattern, replacement in _RULES:
        if literal is not None:
            haystack = lowered if pattern.flags & re.IGNORECASE else text
            if literal not in haystack:
                continue
        text = pattern.sub(replacement, text)
    return text


def rules() -> list[tuple[str | None, re.Pattern[str], str | Replacement]]:
    """The rules in the order ``redact_text`` applies them (for tests of the literal checks)."""
    return list(_RULES)
