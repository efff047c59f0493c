"""Apply Alembic migrations programmatically (``eventgate migrate`` and ``serve`` at start)."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config

import app
from alembic import command


def alembic_config(database_url: str) -> Config:
    root = Path(app.__file__).resolve().parent.parent
    ini = root / "alembic.ini"
    if not ini.exists():  # installed without the source tree: look beside the working dir
        ini = Path.cwd() / "alembic.ini"
    config = Config(str(ini))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade_head(database_url: str) -> None:
    """Blocking: runs its own event loop, so call it from a thread inside async code."""
    command.upgrade(alembic_config(database_url), "head")
