"""twin tables (standing forecasts), added by issue 4.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forecasts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("horizon_s", sa.Float(), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=True),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("forecasts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_forecasts_cluster_kind_created", ["cluster_id", "kind", "created_at"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("forecasts", schema=None) as batch_op:
        batch_op.drop_index("ix_forecasts_cluster_kind_created")
    op.drop_table("forecasts")
