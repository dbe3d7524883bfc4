"""The store's schema comes from the migrations, on both backends, and concurrent start-ups don't race."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import inspect, text

from finetwin.schema import migrate
from twin.db import make_engine


def test_migrations_create_every_table_and_are_idempotent(database_url: str) -> None:
    engine = make_engine(database_url)
    migrate(engine)
    migrate(engine)  # a second start-up finds the schema current
    tables = set(inspect(engine).get_table_names())
    assert {"telemetry_events", "jobs", "observed_runs", "nodes", "alembic_version"} <= tables
    with engine.connect() as connection:
        heads = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    assert len(heads) == 1
    engine.dispose()


def test_concurrent_migrations_on_postgres_do_not_race(postgres_url: str) -> None:
    engines = [make_engine(postgres_url) for _ in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        list(pool.map(migrate, engines))  # would raise DuplicateTable without the advisory lock
    assert "jobs" in inspect(engines[0]).get_table_names()
    for engine in engines:
        engine.dispose()
