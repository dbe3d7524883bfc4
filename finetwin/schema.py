"""The combined schema of every package's tables, and its migrations (Alembic, `finetwin/migrations`).

Only the application knows every package's tables, so the migrations live here and not in `twin`: a
library never migrates a database itself; the wiring (or a test fixture) does, once, before the parts run.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError as AlembicError
from sqlalchemy import Connection, Engine, MetaData, inspect, text
from sqlalchemy.exc import DBAPIError

from twin.db import normalize_url

MIGRATIONS = Path(__file__).with_name("migrations")
_MIGRATION_LOCK_KEY = 0x66696E6574776E  # "finetwn"


class StoreError(Exception):
    """A store this finetwin cannot use as it is, said in words its user can act on."""


def finetwin_metadata() -> MetaData:
    """Every package's tables, as the code declares them (what the migrations build)."""
    from sqlmodel import SQLModel

    import advisor.records  # noqa: F401  (keys, SLOs, recommendations, audit log, outbox: 0004; plans: 0015)
    import calibrate.records  # noqa: F401  (model versions, stored predictions, live errors: migration 0002)
    import twin.forecast_store  # noqa: F401  (standing forecasts: 0003; scores: 0006; their sums: 0008)
    import twin.store  # noqa: F401  (jobs, nodes, telemetry events: 0001)

    return SQLModel.metadata


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Create or upgrade the schema to `revision` on the engine's database."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with _sqlite_file_lock(engine), engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Processes starting together (two ingest workers, the API) must not race to create the schema:
            # the lock is held until this transaction ends, and the second one then finds it up to date.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        _check_not_another_applications(connection)
        try:
            command.upgrade(config, revision)
        except AlembicError:
            _check_known_revision(connection, config)  # the usual reason, said as such
            raise


@contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    """PostgreSQL's advisory lock, for a SQLite file: a lock file beside it, held while the schema is
    migrated. Processes starting together on a new store (the API and an ingest worker) raced to create it,
    and all but one stopped ("table jobs already exists")."""
    database = engine.url.database
    if (
        engine.dialect.name != "sqlite"
        or not database
        or database == ":memory:"
        or database.startswith("file:")
    ):
        yield
        return
    try:
        handle = open(f"{database}.migrate.lock", "a")  # noqa: SIM115  (held across the yield)
    except OSError:  # no such directory: SQLite says so itself, in words the caller turns into a message
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _check_not_another_applications(connection: Connection) -> None:
    """StoreError when finetwin never migrated the store and it holds tables of the names finetwin's would
    have: another application's database. Said before anything is written (SQLite does not take back a
    table created in a transaction that then fails)."""
    existing = set(inspect(connection).get_table_names())
    if not existing or "alembic_version" in existing:
        return
    clash = sorted(existing & set(finetwin_metadata().tables))
    if clash:
        raise StoreError(
            f"it holds tables finetwin did not make ({', '.join(clash)}) and no record of finetwin's "
            "migrations: is it another application's database? Use a store of finetwin's own"
        )


def _check_known_revision(connection: Connection, config: Config) -> None:
    """StoreError when the store is at a revision this finetwin has no migration for: a newer finetwin
    migrated it (Alembic's own message, "Can't locate revision", came as a traceback)."""
    scripts = ScriptDirectory.from_config(config)
    known = {script.revision for script in scripts.walk_revisions()}
    for current in MigrationContext.configure(connection).get_current_heads():
        if current not in known:
            raise StoreError(
                f"its schema is at revision {current}, which this finetwin does not know (it knows up to "
                f"{scripts.get_current_head()}): a newer finetwin migrated it. Run that one, or use another "
                "store"
            )


def store_failure(exc: Exception) -> str:
    """Why a store could not be opened or migrated, without the SQL or the driver's traceback, and what to
    do where that is known."""
    if not isinstance(exc, DBAPIError):
        return str(exc)
    # PostgreSQL's own message without the statement it quotes; a client-side error (a refused connection)
    # has none, and its text may go on with a hint of the driver's.
    primary = getattr(getattr(exc.orig, "diag", None), "message_primary", None)
    reason = primary or str(exc.orig).strip()
    if "file is not a database" in reason:  # SQLite's word for a file of anything else
        return f"{reason}: point FINETWIN_DATABASE_URL or FINETWIN_DATA_DIR at finetwin's store"
    if getattr(exc.orig, "sqlstate", None) == "42501":  # PostgreSQL's insufficient_privilege
        return (
            f"{reason}: its schema needs migrating, and this role may not; run `finetwin migrate` as the "
            "schema's owner"
        )
    return reason
