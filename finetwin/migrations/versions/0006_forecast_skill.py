"""forecast skill (issue 12): a stored forecast's start on the twin's clock, its scores, and an index on
the telemetry's event time (the twin's clock reads the newest one; a backtest rebuilds the state at T).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("forecasts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("start", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("telemetry_events", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_events_cluster_ts", ["cluster_id", "ts"], unique=False)
    op.create_table(
        "forecast_scores",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("forecast_id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("figure", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("interval_index", sa.Integer(), nullable=False),
        sa.Column("interval_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("interval_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("forecast_mean", sa.Float(), nullable=False),
        sa.Column("forecast_p10", sa.Float(), nullable=False),
        sa.Column("forecast_p90", sa.Float(), nullable=False),
        sa.Column("actual", sa.Float(), nullable=False),
        sa.Column("inside", sa.Boolean(), nullable=False),
        sa.Column("scored_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("forecast_id", "figure", "interval_index", name="uq_forecast_scores_interval"),
    )
    with op.batch_alter_table("forecast_scores", schema=None) as batch_op:
        batch_op.create_index(
            "ix_forecast_scores_cluster_start", ["cluster_id", "interval_start"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("forecast_scores", schema=None) as batch_op:
        batch_op.drop_index("ix_forecast_scores_cluster_start")
    op.drop_table("forecast_scores")
    with op.batch_alter_table("telemetry_events", schema=None) as batch_op:
        batch_op.drop_index("ix_telemetry_events_cluster_ts")
    with op.batch_alter_table("forecasts", schema=None) as batch_op:
        batch_op.drop_column("start")
