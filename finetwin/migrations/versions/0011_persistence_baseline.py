"""Forecast scores keep what persistence would have forecast (the interval before the forecast began, again),
and the skill's daily sums the baseline's error beside the twin's over the same intervals: the skill says
whether the twin beats "it stays as it is" (twin.skill).

Scores written before have no baseline (NULL) and are left out of both sums of the comparison.

Stored forecasts also keep the models that made them in a column of their own (`forecasts.models`, NULL for
those stored before): the forecast drawn against what happened is chosen among the calibrated models' ones
without reading every document.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("forecasts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("models", sa.String(length=200), nullable=True))
    with op.batch_alter_table("forecast_scores", schema=None) as batch_op:
        batch_op.add_column(sa.Column("persistence", sa.Float(), nullable=True))
    with op.batch_alter_table("forecast_skill_days", schema=None) as batch_op:
        batch_op.add_column(sa.Column("persistence_n", sa.BigInteger(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("sum_abs_error_paired", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("sum_abs_persistence_error", sa.Float(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("forecast_skill_days", schema=None) as batch_op:
        batch_op.drop_column("sum_abs_persistence_error")
        batch_op.drop_column("sum_abs_error_paired")
        batch_op.drop_column("persistence_n")
    with op.batch_alter_table("forecast_scores", schema=None) as batch_op:
        batch_op.drop_column("persistence")
    with op.batch_alter_table("forecasts", schema=None) as batch_op:
        batch_op.drop_column("models")
