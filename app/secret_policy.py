"""Which credentials a serving process may start with.

The built-in example config falls back to development secrets when its variables are unset
(``${GITHUB_WEBHOOK_SECRET:-dev-github-secret}`` ...), and docker-compose falls back to
``change-me-admin-token``. Anyone can read those values in this repository, so a process
holding one accepts forged webhooks (or admin calls) from whoever can reach it:

- on a loopback address (127.0.0.0/8, ::1, localhost) they are allowed, with a warning;
- on any other address the process refuses to start, unless the operator says it is a demo
  (``EVENTGATE_ALLOW_DEV_SECRETS=true``), and still warns;
- an admin token shorter than ``MIN_SECRET_LENGTH`` is refused on any address.

The development values are read from the built-in config itself (its defaults with every
variable unset), so this list cannot drift from the file.
"""

from __future__ import annotations

import ipaddress
from functools import cache

from app.config import GatewayConfig, load_config
from app.settings import Settings
from app.source_config import MIN_SECRET_LENGTH, SourceConfig

# docker-compose.yml's default for EVENTGATE_ADMIN_TOKEN.
COMPOSE_ADMIN_TOKEN = "change-me-admin-token"  # noqa: S105 (public: refused, not used)
ALLOW_VARIABLE = "EVENTGATE_ALLOW_DEV_SECRETS"


def credentials(source: SourceConfig) -> list[tuple[str, str]]:
    """(key name, value) of every credential value of a source."""
    found = [("secret", value) for value in source.secrets()]
    found += [("token", value) for value in source.tokens()]
    if source.basic_auth is not None:
        found.append(("basic_auth.password", source.basic_auth.password.get_secret_value()))
    return found


@cache
def development_secrets() -> frozenset[str]:
    builtin = load_config(None, env={})
    values = {value for source in builtin.sources.values() for _, value in credentials(source)}
    return frozenset(values | {COMPOSE_ADMIN_TOKEN})


def development_keys(config: GatewayConfig, admin_token: str | None) -> list[str]:
    """Names (never values) of the settings that hold a development value."""
    keys = [
        f"sources.{name}.{key}"
        for name, source in config.sources.items()
        for key, value in credentials(source)
        if value in development_secrets()
    ]
    if admin_token in development_secrets():
        keys.append("EVENTGATE_ADMIN_TOKEN")
    return keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


def refusal(*, config: GatewayConfig, settings: Settings, host: str) -> str | None:
    """Why a serving process must not start with these credentials on ``host``, or None."""
    token = settings.admin_token
    if token and len(token) < MIN_SECRET_LENGTH:
        return (
            f"EVENTGATE_ADMIN_TOKEN has {len(token)} characters; at least {MIN_SECRET_LENGTH}"
            " are needed"
        )
    keys = development_keys(config, token)
    if not keys or is_loopback(host) or settings.allow_dev_secrets:
        return None
    return (
        f"refusing to listen on {host}: {', '.join(keys)} hold built-in development values"
        " that anyone can read in eventgate's source. Set real ones (the built-in config"
        " reads GITHUB_WEBHOOK_SECRET, ALERTMANAGER_TOKEN and SENSORS_SECRET), listen on a"
        f" loopback address, or set {ALLOW_VARIABLE}=true for a local demo."
    )
