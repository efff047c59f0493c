"""Which keys name a secret: the rule, and the same vocabulary as a pattern for the scans.

A key is split into words on ``_``, ``-``, ``.``, spaces and camelCase (``AWS_SECRET_ACCESS_KEY``,
``clientSecret``, ``x-api-key`` → ``aws secret access key``, ``client secret``, ``x api key``);
words made only of digits are dropped, trailing digits are ignored (``password2``, ``cvv2``),
and so are trailing words that do not change what the value is (``confirmation``, ``value``,
``new``, ``old`` ...). The key names a secret when, after that:

- its last word is a secret word (password, passwd, pwd, passphrase, secret, token,
  credentials, authorization, auth, cookie, pan, cvv ...), or a one-word key ends with a long
  one (``adminpassword``, ``jsessionid``); or
- its last two words are a secret pair (api key, access key, secret key, private key,
  session id, card number ...).

A plural names the same secret (``passwords``, ``api_keys``, ``accessKeys``: a list or a map of
them), except ``tokens`` after anything but a word that says what the tokens are for
(``access_tokens``, ``refresh_tokens``, ``id_tokens`` hold tokens; ``max_tokens``,
``input_tokens`` and ``tokens_used`` count them). ``auths``, ``authorizations`` and ``pans``
are not plurals of secrets either (registry maps, payment authorisations, cooking).

Only the end of the key decides, because the end says what the value is:
``access_tokens_url`` and ``keys_url`` are URLs, ``token_type`` a type, ``max_tokens`` and
``tokens_used`` counts, ``aws_access_key_id`` an identifier, ``password_hash`` a hash.
"""

from __future__ import annotations

import re

# The last word → the kind written in ``[REDACTED:<kind>]``.
WORDS = {
    **dict.fromkeys(("password", "passwd", "pwd", "passphrase", "passcode"), "password"),
    **dict.fromkeys(("secret", "secrets"), "secret"),
    "token": "token",
    "apikey": "api_key",
    "accesskey": "access_key",
    "secretkey": "secret_key",
    "privatekey": "private_key",
    **dict.fromkeys(("credential", "credentials", "creds"), "credentials"),
    **dict.fromkeys(("authorization", "auth"), "authorization"),
    **dict.fromkeys(("cookie", "cookies"), "cookie"),
    "sessionid": "session",
    **dict.fromkeys(("cardnumber", "ccnumber", "pan", "cvv", "cvc", "ccv"), "card"),
}
# Plurals: every secret word but these (see the rule above).
_NO_PLURAL = frozenset({"token", "auth", "authorization", "pan"})
WORDS |= {f"{w}s": kind for w, kind in WORDS.items() if w[-1] != "s" and w not in _NO_PLURAL}
# A one-word key ending with one of these (``dbpassword``, ``authtoken``, ``jsessionid``) is a
# secret too; short words are left out, since ``span`` ends with ``pan`` and ``oauth`` is not
# ``auth``.
SUFFIXES = tuple(word for word in WORDS if len(word) >= 5)
# The last two words → the kind.
PAIRS = {
    ("api", "key"): "api_key",
    ("access", "key"): "access_key",
    ("secret", "key"): "secret_key",
    ("encryption", "key"): "secret_key",
    ("master", "key"): "secret_key",
    ("private", "key"): "private_key",
    ("signing", "key"): "private_key",
    ("session", "id"): "session",
    ("session", "key"): "session",
    ("card", "number"): "card",
    ("card", "num"): "card",
    ("card", "no"): "card",
    ("cc", "number"): "card",
    ("credit", "card"): "card",
    ("security", "code"): "card",
}
PAIRS |= {(first, f"{second}s"): kind for (first, second), kind in PAIRS.items()}
# Tokens for something: "tokens" alone counts them.
PAIRS |= dict.fromkeys(
    ((word, "tokens") for word in ("access", "refresh", "auth", "api", "bearer", "id", "session")),
    "token",
)
QUALIFIERS = frozenset(
    {"confirmation", "confirm", "value", "plain", "plaintext", "raw", "b64", "base64"}
    | {"new", "old", "current"}
)
CARD_WORDS = frozenset({"card", "cards", "cc", "creditcard", "creditcards"})
# The last two letters of every word a secret-naming key can end with (a secret word, the
# second word of a pair, a qualifier), for scans that skip keys which cannot name one.
NAME_ENDS = frozenset(word[-2:] for word in (*WORDS, *(b for _, b in PAIRS), *QUALIFIERS))
_SECOND_WORDS = frozenset(b for _, b in PAIRS)
# What separates the words of a key (camelCase aside).
_SEP = "[-_. ]"

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_SPLIT = re.compile(f"{_SEP}+")
# Decisions remembered, for keys up to _CACHED_KEY_CHARS long; emptied when full, so a sender
# making up keys cannot grow it. A dict lookup is all a known key costs.
_DECIDED: dict[str, str | None] = {}
_CACHED_KEYS = 4096
_CACHED_KEY_CHARS = 80
_TAIL_CHARS = 256


def secret_kind(key: str) -> str | None:
    """The kind of secret ``key`` names (``password``, ``token``, ``api_key`` ...), or None."""
    try:
        return _DECIDED[key]
    except KeyError:
        pass
    kind = _decide(key)
    if len(key) <= _CACHED_KEY_CHARS:
        if len(_DECIDED) >= _CACHED_KEYS:
            _DECIDED.clear()
        _DECIDED[key] = kind
    return kind


def names_card(key: str) -> bool:
    """Whether ``key`` names a card itself (``card``, ``credit_card``, ``cards``, ``cc``): what
    sits under it is card data, a card number among it."""
    words = _named_words(key)
    return bool(words) and words[-1] in CARD_WORDS


def needs_words_before(word: str) -> bool:
    """Whether a key ending with ``word`` (one word of a text, no spaces) can name a secret
    only with the words before it: ``key`` of "api key", ``2`` of "password 2",
    ``confirmation`` of "password confirmation"."""
    # A word that decides is short: its end is enough, whatever the length of ``word``.
    ends = _words(word[-24:])
    return not ends or ends[-1] in _SECOND_WORDS or ends[-1] in QUALIFIERS


def _words(key: str) -> list[str]:
    """The key's words, in lower case, trailing digits dropped."""
    words = (w.rstrip("0123456789") for w in _SPLIT.split(_CAMEL.sub(" ", key).lower()))
    return [w for w in words if w]


def _decide(key: str) -> str | None:
    # Only the end decides: a long key is read from its last characters when they hold three
    # words or more once qualifiers are dropped (the first may be cut, the last two are
    # whole), and whole otherwise, so a made-up key of 60,000 characters costs a slice.
    if len(key) > _TAIL_CHARS:
        tail = _named_words(key[-_TAIL_CHARS:])
        if len(tail) >= 3:
            return _decide_words(tail[-2:])
    return _decide_words(_named_words(key))


def _named_words(key: str) -> list[str]:
    """The key's words, without the qualifiers that end it."""
    words = _words(key)
    while words and words[-1] in QUALIFIERS:
        words.pop()
    return words


def _decide_words(words: list[str]) -> str | None:
    """The kind named by ``words`` (the whole key when it is one word)."""
    if not words:
        return None
    if len(words) >= 2 and (kind := PAIRS.get((words[-2], words[-1]))) is not None:
        return kind
    last = words[-1]
    if (kind := WORDS.get(last)) is not None:
        return kind
    if len(words) == 1:
        for suffix in SUFFIXES:
            if last.endswith(suffix):
                return WORDS[suffix]
    return None


def name_pattern() -> str:
    """A regex matching, in lower-cased text, the end of every key the rule calls secret, up
    to where a separator (``:``, ``=``, a closing quote) may follow: a superset of the rule,
    for scans that must not miss a key (``password``, ``apikey``, ``client_secret_2``,
    ``token_value``). It has no look-around, so the Rust engine of ``app.redaction.text``
    runs it."""
    singles = "|".join(sorted(WORDS, key=len, reverse=True))
    # Digits may end any word ("session2_id"): the rule drops them.
    pairs = "|".join(f"{a}[-_. 0-9]*{b}" for a, b in PAIRS)
    tail = "|".join(sorted(QUALIFIERS, key=len, reverse=True))
    return f"(?:{pairs}|{singles})(?:[-_. 0-9]|{tail})*"
