"""forecast skill from running sums (`twin.skill_totals`): per figure and UTC day of the intervals' start,
and each scored forecast's latest scored interval; filled from the scores already stored.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_EDGE = 1e-9  # as twin.skill_totals: an actual this close to 0 has no percentage error
_SUMS = ("n", "inside", "raw_inside", "nonzero", "sum_error", "sum_abs_error", "sum_abs_actual",
         "sum_relative_error")  # fmt: skip


def upgrade() -> None:
    days = op.create_table(
        "forecast_skill_days",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("figure", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("n", sa.BigInteger(), nullable=False),
        sa.Column("inside", sa.BigInteger(), nullable=False),
        sa.Column("raw_inside", sa.BigInteger(), nullable=False),
        sa.Column("nonzero", sa.BigInteger(), nullable=False),
        sa.Column("sum_error", sa.Float(), nullable=False),
        sa.Column("sum_abs_error", sa.Float(), nullable=False),
        sa.Column("sum_abs_actual", sa.Float(), nullable=False),
        sa.Column("sum_relative_error", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster_id", "figure", "day", name="uq_forecast_skill_days"),
    )
    forecasts = op.create_table(
        "forecast_skill_forecasts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("forecast_id", sa.Integer(), nullable=False),
        sa.Column("latest_interval_start", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("cluster_id", "forecast_id", name="uq_forecast_skill_forecasts"),
    )
    with op.batch_alter_table("forecast_skill_forecasts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_forecast_skill_forecasts_cluster_latest",
            ["cluster_id", "latest_interval_start"],
            unique=False,
        )
    _fill(days, forecasts)


def _fill(days: sa.Table, forecasts: sa.Table) -> None:
    """The sums of every score stored so far, read a batch at a time (a day bucket needs the date in UTC,
    which SQLite and PostgreSQL spell differently in SQL). SQLite gives its times back without a zone: UTC,
    as the store writes them."""
    scores = sa.table(
        "forecast_scores",
        sa.column("interval_start", sa.DateTime(timezone=True)),
        sa.column("inside", sa.Boolean()),
        *(sa.column(name) for name in ("cluster_id", "forecast_id", "figure", "forecast_mean", "forecast_p10",
                                        "forecast_p90", "actual", "raw_p10", "raw_p90")),
    )  # fmt: skip
    sums: dict[tuple[str, str, object], list[float]] = {}
    latest: dict[tuple[str, int], datetime] = {}
    # On the statement, not the connection: that one runs the migrations after this one (and their UPDATEs
    # in a server-side cursor, a syntax error).
    result = op.get_bind().execute(sa.select(scores).execution_options(yield_per=20_000))
    for row in result:
        start = row.interval_start
        start = start.replace(tzinfo=UTC) if start.tzinfo is None else start.astimezone(UTC)
        error, actual = row.forecast_mean - row.actual, row.actual
        low = row.forecast_p10 if row.raw_p10 is None else row.raw_p10
        high = row.forecast_p90 if row.raw_p90 is None else row.raw_p90
        nonzero = abs(actual) > _EDGE
        added = (1, int(bool(row.inside)), int(low - _EDGE <= actual <= high + _EDGE), int(nonzero), error,
                 abs(error), abs(actual), abs(error) / abs(actual) if nonzero else 0.0)  # fmt: skip
        bucket = sums.setdefault((row.cluster_id, row.figure, start.date()), [0] * len(_SUMS))
        for i, value in enumerate(added):
            bucket[i] += value
        key = (row.cluster_id, int(row.forecast_id))
        latest[key] = max(latest.get(key, start), start)
    if sums:
        op.bulk_insert(days, [
            {"cluster_id": c, "figure": f, "day": d, **dict(zip(_SUMS, values, strict=True))}
            for (c, f, d), values in sums.items()
        ])  # fmt: skip
    if latest:
        op.bulk_insert(forecasts, [
            {"cluster_id": c, "forecast_id": f, "latest_interval_start": t} for (c, f), t in latest.items()
        ])  # fmt: skip


def downgrade() -> None:
    with op.batch_alter_table("forecast_skill_forecasts", schema=None) as batch_op:
        batch_op.drop_index("ix_forecast_skill_forecasts_cluster_latest")
    op.drop_table("forecast_skill_forecasts")
    op.drop_table("forecast_skill_days")
