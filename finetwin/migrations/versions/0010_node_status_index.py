"""The nodes' status reports by time, in a partial index of their own: a backtest at T reads the events of
its window only, and the nodes' reports from before it (a node reports its status when it changes, so its
last report before T can be months older) through this index, instead of every event up to T.

Only `node.status` events enter it, so ingest's insert of every other event does not pay for it.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

NODE_STATUS_ONLY = sa.text("type = 'node.status'")


def upgrade() -> None:
    op.create_index(
        "ix_telemetry_events_node_status", "telemetry_events", ["cluster_id", "ts"], unique=False,
        sqlite_where=NODE_STATUS_ONLY, postgresql_where=NODE_STATUS_ONLY,
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_telemetry_events_node_status", table_name="telemetry_events")
