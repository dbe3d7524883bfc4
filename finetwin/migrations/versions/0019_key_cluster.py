"""The cluster an API key is for: none (every cluster's API takes it, as every key before this revision) or
one (only the API that serves that cluster, FINETWIN_CLUSTER_ID, takes it). With several clusters on one
store, a key handed to one cluster's operators approved the other cluster's actions too.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, without a default: the keys handed out already keep working on every cluster's API.
    op.add_column("api_keys", sa.Column("cluster_id", sqlmodel.sql.sqltypes.AutoString(length=200)))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch_op:
        batch_op.drop_column("cluster_id")
