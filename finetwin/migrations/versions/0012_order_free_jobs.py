"""A job's row keeps the time of its progress report and the id of the event that ended it, so that what the
store holds of a job is the same whatever order its events arrived in (twin.job_fold): a report dated after
the job ended is set aside even when it came first, and of two terminal events the earlier one ends the job.

Rows stored before have neither (NULL): their progress counts as dated long ago, and their end stands
against a terminal event of the same time and kind.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ended_by", sa.String(length=36), nullable=True))
        batch_op.add_column(sa.Column("progress_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("progress_at")
        batch_op.drop_column("ended_by")
