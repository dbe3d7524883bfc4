"""The skill's daily sums keep squared errors beside the absolute ones, the twin's and persistence's: each
declared SLO's forecast (the share of runs in which it held, per interval) is scored against whether it held
on the record, and a probability against what happened is read by its Brier score (twin.skill).

Days summed before have 0 in these columns, and no SLO figure: SLOs were not scored before.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_COLUMNS = ("sum_squared_error", "sum_squared_error_paired", "sum_squared_persistence_error")


def upgrade() -> None:
    with op.batch_alter_table("forecast_skill_days", schema=None) as batch_op:
        for name in _COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("forecast_skill_days", schema=None) as batch_op:
        for name in reversed(_COLUMNS):
            batch_op.drop_column(name)
