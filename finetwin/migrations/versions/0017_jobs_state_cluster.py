"""The jobs' state index with the cluster after the state: (state, cluster_id, submitted_at), in place of
(state, submitted_at). The API counts and lists the jobs of the cluster it serves (FINETWIN_CLUSTER_ID), and
each count by state then read every job's row for its cluster (163 ms at 200,000 jobs on SQLite; 42 ms from
this index alone). After the state, not first: an index that leads with the cluster, which most stores hold
one of, drew SQLite's planner to it for every query of the cluster's jobs, and the forecast's reads slowed.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_state_cluster_submitted_at", "jobs", ["state", "cluster_id", "submitted_at"], unique=False
    )
    op.drop_index("ix_jobs_state_submitted_at", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_state_submitted_at", "jobs", ["state", "submitted_at"], unique=False)
    op.drop_index("ix_jobs_state_cluster_submitted_at", table_name="jobs")
