"""How far back each cluster's telemetry is whole (`twin.store.TelemetryRetention`): the store prunes what
is older than FINETWIN_KEEP_TELEMETRY_DAYS of telemetry time (`twin.retention`), and ingest and the backtest
read here where the record now starts.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "telemetry_retention",
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("kept_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("cluster_id"),
    )


def downgrade() -> None:
    op.drop_table("telemetry_retention")
