"""forecast scores keep the ensemble's own band beside the recalibrated one (twin.band_calibration).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("forecast_scores", schema=None) as batch_op:
        batch_op.add_column(sa.Column("raw_p10", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("raw_p90", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("forecast_scores", schema=None) as batch_op:
        batch_op.drop_column("raw_p90")
        batch_op.drop_column("raw_p10")
