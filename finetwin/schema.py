"""The combined schema of every package's tables, and its migrations (Alembic, `finetwin/migrations`).

Only the application knows every package's tables, so the migrations live here and not in `twin`: a
library never migrates a database itself; the wiring (or a test fixture) does, once, before the parts run.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

from twin.db import normalize_url

MIGRATIONS = Path(__file__).with_name("migrations")
_MIGRATION_LOCK_KEY = 0x66696E6574776E  # "finetwn"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Create or upgrade the schema to `revision` on the engine's database."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Processes starting together (two ingest workers, the API) must not race to create the schema:
            # the lock is held until this transaction ends, and the second one then finds it up to date.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
