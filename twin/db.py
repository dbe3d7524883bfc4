"""Engines and sessions for the store.

SQLite by default (a file under the data directory), PostgreSQL through psycopg 3 when
`FINETWIN_DATABASE_URL` is set. The schema's migrations belong to the application (`finetwin.schema`),
which knows every package's tables.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlmodel import Session

from twin.settings import TwinSettings

# Bound parameters per IN (...) list: under SQLite's old limit of 999 variables, small enough for
# PostgreSQL's planner.
IN_CHUNK = 900
T = TypeVar("T")


def in_chunks(values: Sequence[T]) -> Iterator[Sequence[T]]:
    """The values in slices short enough for one IN (...) on every store."""
    for start in range(0, len(values), IN_CHUNK):
        yield values[start : start + IN_CHUNK]


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
    engine = create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)

    @event.listens_for(engine, "connect")
    def _lenient_times(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        register_lenient_time_loaders(dbapi_connection)

    return engine


def register_lenient_time_loaders(connection: Any) -> None:
    """Read a stored time Python cannot hold as None (unknown) instead of failing the whole query.

    PostgreSQL holds times from 4713 BC to 294276 AD; Python's datetime, years 1 to 9999. Telemetry is now
    bounded to ten years around its arrival (twin.limits), but a row stored before that (year 10000 from
    `9999-12-31T23:59:59-01:00`, 1 BC, `infinity`) made every query that read it fail, and the API answer
    500 until the row was deleted by hand. Costs ~1 µs per time read (the C loader, wrapped)."""
    import psycopg
    from psycopg.adapt import Loader

    for name in ("timestamptz", "timestamp"):
        oid = connection.adapters.types[name].oid
        for format_ in (psycopg.pq.Format.TEXT, psycopg.pq.Format.BINARY):
            strict = connection.adapters.get_loader(oid, format_)
            if strict is None or getattr(strict, "lenient", False):
                continue

            class Lenient(Loader):
                lenient = True
                format = format_
                _strict = strict

                def __init__(self, oid: int, context: Any = None) -> None:
                    super().__init__(oid, context)
                    self._inner = self._strict(oid, context)

                def load(self, data: Any) -> Any:
                    try:
                        return self._inner.load(data)
                    except psycopg.DataError:  # out of Python's range: the time is unknown
                        return None

            connection.adapters.register_loader(name, Lenient)


def engine_from_settings(settings: TwinSettings) -> Engine:
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
