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


def test_the_migrations_build_the_tables_the_code_declares(database_url: str) -> None:
    """Every table, column, index and constraint of the SQLModel classes, as the migrations left them: a
    change to one without the other is found here, not in a deployment."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    import advisor.records  # noqa: F401  (every package's tables, as finetwin/migrations/env.py imports them)
    import calibrate.records  # noqa: F401
    import twin.forecast_store  # noqa: F401
    import twin.store  # noqa: F401

    engine = make_engine(database_url)
    migrate(engine)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert differences == []
    engine.dispose()
