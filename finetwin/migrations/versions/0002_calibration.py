"""calibration tables (model versions, stored predictions, live error), added by issue 3.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_versions",
        sa.Column("version", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("data_fingerprint", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("rows_by_source", sa.JSON(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("promoted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("version"),
    )
    op.create_table(
        "job_predictions",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("model_version", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("predicted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("rule", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("p_valid", sa.Float(), nullable=False),
        sa.Column("tokens_per_second_p10", sa.Float(), nullable=True),
        sa.Column("tokens_per_second_p50", sa.Float(), nullable=True),
        sa.Column("tokens_per_second_p90", sa.Float(), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("job_id"),
    )
    with op.batch_alter_table("job_predictions", schema=None) as batch_op:
        batch_op.create_index("ix_job_predictions_model_version", ["model_version"], unique=False)

    op.create_table(
        "live_errors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("model_version", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("predicted_outcome", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("actual_outcome", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("outcome_error", sa.Integer(), nullable=False),
        sa.Column("p_valid", sa.Float(), nullable=False),
        sa.Column("failure_brier", sa.Float(), nullable=False),
        sa.Column("measured_tokens_per_second", sa.Float(), nullable=True),
        sa.Column("predicted_tokens_per_second", sa.Float(), nullable=True),
        sa.Column("ape", sa.Float(), nullable=True),
        sa.Column("in_band", sa.Boolean(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id"),
    )
    with op.batch_alter_table("live_errors", schema=None) as batch_op:
        batch_op.create_index("ix_live_errors_ended_at", ["ended_at"], unique=False)
        batch_op.create_index("ix_live_errors_model_version_id", ["model_version", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("live_errors", schema=None) as batch_op:
        batch_op.drop_index("ix_live_errors_model_version_id")
        batch_op.drop_index("ix_live_errors_ended_at")
    op.drop_table("live_errors")
    with op.batch_alter_table("job_predictions", schema=None) as batch_op:
        batch_op.drop_index("ix_job_predictions_model_version")
    op.drop_table("job_predictions")
    op.drop_table("model_versions")
