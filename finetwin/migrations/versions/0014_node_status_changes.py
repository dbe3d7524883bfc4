"""The nodes' reports that change something, in a table of their own (`twin.store.NodeStatusChange`), and
each node's latest report time (`nodes.last_report_at`), which ingest keeps from now on: the GPUs up over a
window read a few rows per node, where a node that reports every minute as a heartbeat made them read one
row per node and minute. Filled here from the reports already stored.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_status_changes",
        sa.Column(
            "event_id",
            sa.String(length=36).with_variant(postgresql.UUID(as_uuid=False), "postgresql"),
            nullable=False,
        ),
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("node_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("gpu_model", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.PrimaryKeyConstraint("event_id"),
    )
    op.create_index(
        "ix_node_status_changes_cluster_ts", "node_status_changes", ["cluster_id", "ts"], unique=False
    )
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.add_column(sa.Column("last_report_at", sa.DateTime(timezone=True), nullable=True))
    _fill()


def _fill() -> None:
    """The changes among the reports stored so far: each report whose status, GPUs or model differ from the
    node's report before it (by time, then by the store's order of two reports of one time), and each
    node's latest report time. In SQL, by a window over the reports (the payload's fields read by the
    database: SQLite and PostgreSQL spell that differently)."""
    connection = op.get_bind()
    if connection.dialect.name == "postgresql":
        node, status = "payload->>'node_id'", "payload->>'status'"
        gpus, model = "(payload->>'gpu_count')::integer", "payload->>'gpu_model'"
    else:
        node, status = "json_extract(payload, '$.node_id')", "json_extract(payload, '$.status')"
        gpus, model = "json_extract(payload, '$.gpu_count')", "json_extract(payload, '$.gpu_model')"
    reports = (
        f"SELECT event_id, cluster_id, {node} AS node_id, ts, {status} AS status, {gpus} AS gpu_count, "
        f"{model} AS gpu_model FROM telemetry_events WHERE type = 'node.status'"
    )
    columns = "event_id, cluster_id, node_id, ts, status, gpu_count, gpu_model"
    connection.execute(
        sa.text(
            f"INSERT INTO node_status_changes ({columns}) SELECT {columns} FROM ("
            f"SELECT {columns}, LAG(status) OVER w AS was_status, LAG(gpu_count) OVER w AS was_gpus, "
            f"LAG(gpu_model) OVER w AS was_model FROM ({reports}) AS reports "
            "WINDOW w AS (PARTITION BY cluster_id, node_id "
            "ORDER BY ts, status, gpu_count, gpu_model, event_id)"
            ") AS ordered WHERE was_status IS NULL OR was_status <> status OR was_gpus <> gpu_count "
            "OR was_model <> gpu_model"
        )
    )
    latest = connection.execute(
        sa.text(
            f"SELECT {node} AS node_id, MAX(ts) FROM telemetry_events WHERE type = 'node.status' GROUP BY 1"
        )
    ).all()
    if latest:
        connection.execute(
            sa.text("UPDATE nodes SET last_report_at = :ts WHERE node_id = :node_id"),
            [{"node_id": node_id, "ts": ts} for node_id, ts in latest],
        )


def downgrade() -> None:
    with op.batch_alter_table("nodes", schema=None) as batch_op:
        batch_op.drop_column("last_report_at")
    op.drop_index("ix_node_status_changes_cluster_ts", table_name="node_status_changes")
    op.drop_table("node_status_changes")
