"""Engines and sessions for the store.

SQLite by default (a file under the data directory), PostgreSQL through psycopg 3 when
`FINETWIN_DATABASE_URL` is set. The schema's migrations belong to the application (`finetwin.schema`),
which knows every package's tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, event
from sqlmodel import Session

from twin.settings import Settings


def normalize_url(url: str) -> str:
    """`postgresql://` means psycopg 3 here (SQLAlchemy's default would be psycopg2, not installed)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record):  # type: ignore[no-untyped-def]
            # WAL lets the API read while ingest writes; foreign keys are off by default in SQLite.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def engine_from_settings(settings: Settings) -> Engine:
    return make_engine(settings.resolved_database_url())


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: committed when the block ends, rolled back if it raises."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
