"""Alembic environment: runs on the connection `finetwin.schema.migrate` hands over, or on the URL given."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine
from sqlmodel import SQLModel

import advisor.records  # noqa: F401  (keys, SLOs, recommendations, audit log, outbox: migration 0004)
import calibrate.records  # noqa: F401  (model versions, stored predictions, live errors: migration 0002)
import twin.forecast_store  # noqa: F401  (standing forecasts: 0003; scores: 0006; their sums: 0008)
import twin.store  # noqa: F401  (registers the tables on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as own:
        context.configure(connection=own, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
