"""Console sign-in sessions and CSRF tokens, signed with a key derived from the admin token.

- The session cookie holds ``<session id>.<expiry>.<HMAC>``: no token, nothing to look up.
  The key is an HMAC of the admin token, so changing ``EVENTGATE_ADMIN_TOKEN`` ends every
  session, and nothing in the cookie reveals the token. Sign-out removes the cookie; a copy
  of it stays valid until its expiry (``SESSION_SECONDS``) or a token change.
- Every POST of a signed-in page carries ``csrf`` = HMAC(key, session id), checked in
  constant time. The sign-in form, before any session, is a double submit: a random value
  in a SameSite=Strict cookie that the form must repeat.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

SESSION_COOKIE = "eventgate_console"
SIGN_IN_COOKIE = "eventgate_console_sign_in"
COOKIE_PATH = "/console"
SESSION_SECONDS = 8 * 3600
SIGN_IN_SECONDS = 3600
_KEY_LABEL = b"eventgate console session v1"


def token_matches(given: str, token: str) -> bool:
    """Constant time: response timing must not reveal how much of a guess matched. Compared
    as UTF-8 bytes: ``compare_digest`` raises on ``str`` with non-ASCII characters, which a
    form field or a cookie can carry."""
    return hmac.compare_digest(given.encode(), token.encode())


def new_sign_in_nonce() -> str:
    return secrets.token_urlsafe(24)


def sign_in_nonce_matches(cookie: str | None, field: str | None) -> bool:
    return bool(cookie) and bool(field) and token_matches(str(cookie), str(field))


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    expires_at: int


class SessionSigner:
    def __init__(
        self,
        admin_token: str,
        *,
        seconds: int = SESSION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._key = hmac.new(admin_token.encode(), _KEY_LABEL, hashlib.sha256).digest()
        self.seconds = seconds
        self.clock = clock

    def _sign(self, message: str) -> str:
        return hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()

    def issue(self) -> str:
        """A new session's cookie value."""
        payload = f"{secrets.token_urlsafe(18)}.{int(self.clock()) + self.seconds}"
        return f"{payload}.{self._sign('session|' + payload)}"

    def verify(self, value: str | None) -> Session | None:
        """The session of a cookie value, or None (absent, forged, signed with another token,
        or expired)."""
        if not value or value.count(".") != 2:
            return None
        session_id, expires, signature = value.split(".")
        expected = self._sign(f"session|{session_id}.{expires}")
        if not token_matches(signature, expected) or not expires.isdigit():
            return None
        if int(expires) <= self.clock():
            return None
        return Session(id=session_id, expires_at=int(expires))

    def csrf_token(self, session: Session) -> str:
        return self._sign(f"csrf|{session.id}")

    def csrf_matches(self, session: Session, given: str | None) -> bool:
        return bool(given) and token_matches(str(given), self.csrf_token(session))
