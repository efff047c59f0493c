"""``key=value``, ``key: value`` and ``--key value`` whose key names a secret (the rule of
``app.redaction.keys``): form bodies, query strings, headers, log lines, config files,
command lines, JSON text with escaped quotes. The value is replaced; the key, the separator
and the quotes around the value stay.

What the value is: up to the closing quote when it is quoted; one word when the separator
touches it (``password=hunter2 user=bob``, logfmt and query strings); and when a space
follows the separator (``passphrase = correct horse battery staple``, ``Password: ...``), the
words after it on the same line, up to a quote, a backslash, one of ``& , ; ( ) { } < > [ ]``
or a word that starts the next ``key:`` or ``key=``. An option's value (``--password x``,
``-password x``) is the next word or quoted string, unless it starts with ``-``.

A key is up to three words of key characters (``[A-Za-z0-9_.-]``) separated by spaces, the
last one touching the separator: "db password: ...", "API Key = ...", "Password Confirmation:
...". Whether it names a secret is ``secret_kind``'s answer, asked of the last word, then of
the last two or three when the last one needs them ("key" of "api key", "2" of
"password 2").

The scan runs over the reversed text, where every match starts at a separator, so the engine
skips from ``:`` to ``=`` without trying the characters between. Each word is taken whole
(possessive), so the spaces between words and those before the separator are never traded
(what made "password" + 60,000 spaces quadratic); a word before the last starts with a letter
and is at most 64 characters long, as the first words of a name are. The key must end with a
digit, a separator, or two letters that some secret-naming word ends with: most keys that name
none are dropped before Python sees them.
"""

from __future__ import annotations

import re

from app.redaction.keys import NAME_ENDS, needs_words_before, secret_kind

_PENULTIMATE = "".join(sorted({end[0] for end in NAME_ENDS}))
_LAST = "".join(sorted({end[1] for end in NAME_ENDS}))
# Over the reversed text: separator, spaces, a closing quote and its escapes, then the key
# from its last character back.
_SEPARATOR_AND_KEY = re.compile(
    r"[:=][ \t]*+[\"']?\\*+"
    rf"(?:(?=[0-9_.-])|(?i:(?=[{_LAST}][{_PENULTIMATE}])))"
    r"(?P<last>[A-Za-z0-9_.-]++)"
    r"(?: ++[A-Za-z0-9_.-]{1,64}+(?<=[A-Za-z])(?![A-Za-z0-9_.-])){0,2}",
    re.ASCII,
)
_WORD = r"[^\s&\"',;{}()<>\[\]\\]++"
# What follows the separator: spaces and an opening quote (kept), then the value: quoted,
# or words after an optional auth scheme ("Bearer" ...), more than one after a space.
_VALUE = re.compile(
    r"(?P<spaced>[ \t]++)?\\*[\"']?"
    r"(?P<value>(?<=[\"'])[^\"'\\\r\n]++"
    rf"|(?i:(?:bearer|basic|token|digest|negotiate)[ \t]++)?{_WORD}"
    rf"(?(spaced)(?:[ \t]++(?![A-Za-z0-9_.-]++\\*[\"']?[ \t]*+[:=]){_WORD})*+))",
    re.ASCII,
)
# An option and its value, from the dash (found without trying every character).
_OPTION = re.compile(
    r"-(?<![A-Za-z0-9_.-]-)(?P<option>-?[A-Za-z][A-Za-z0-9_.-]*+)[ \t]++"
    r"(?P<value>\"[^\"\r\n]*+\"|'[^'\r\n]*+'|[^\s\"'-][^\s\"']*+)",
    re.ASCII,
)


def redact_assignments(text: str) -> str:
    """``text`` with the value of every assignment whose key names a secret replaced by
    ``[REDACTED:<kind>]``; the same object when there is none. A key that names none takes
    no value, so an assignment inside its value ("https://host/?password=...") is found."""
    size = len(text)
    matches = list(_SEPARATOR_AND_KEY.finditer(text[::-1]))
    out: list[str] = []
    done = 0
    for match in reversed(matches):  # in the order of the text
        key_start = size - match.end()
        if key_start < done:
            continue
        kind = _key_kind(text[key_start : size - match.start("last")])
        value = None if kind is None else _VALUE.match(text, size - match.start())
        if value is None:
            continue
        out += (text[done : value.start("value")], f"[REDACTED:{kind}]")
        done = value.end()
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _key_kind(key: str) -> str | None:
    words = key.split()
    kind = secret_kind(words[-1])
    for n in range(2, len(words) + 1):
        if kind is not None or not needs_words_before(words[-1]):
            break
        kind = secret_kind(" ".join(words[-n:]))
    return kind


def redact_options(text: str) -> str:
    """``text`` with the value of every command-line option naming a secret replaced."""
    return _OPTION.sub(_option, text)


def _option(match: re.Match[str]) -> str:
    kind = secret_kind(match["option"])
    if kind is None:
        return match[0]
    return f"{match[0][: match.start('value') - match.start()]}[REDACTED:{kind}]"
