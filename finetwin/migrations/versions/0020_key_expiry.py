"""When an API key stops working by itself: none (it works until revoked, as every key before this
revision) or a time (`finetwin keys create --expires-in 90d`), after which the API answers it 401 saying
so. A key handed out for a project or a contractor lived until someone remembered to revoke it.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("expires_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.drop_column("expires_at")
