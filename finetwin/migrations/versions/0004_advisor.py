"""advisor tables (SLOs, recommendations, audit log, API keys, actions outbox), added by issue 5.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_STR = sqlmodel.sql.sqltypes.AutoString
_TS = sa.DateTime(timezone=True)

# The audit log is append-only in the database itself, not only by convention in the code.
_PG_APPEND_ONLY = """
CREATE FUNCTION audit_log_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_log_no_update BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
"""
_SQLITE_APPEND_ONLY = (
    "CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log "
    "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END",
    "CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log "
    "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END",
)


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", _STR(length=32), nullable=False),
        sa.Column("name", _STR(length=200), nullable=False),
        sa.Column("role", _STR(length=16), nullable=False),
        sa.Column("key_hash", _STR(length=64), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("key_id"),
    )
    op.create_table(
        "slo_sets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("created_by", _STR(length=200), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "recommendations",
        sa.Column("id", _STR(length=36), nullable=False),
        sa.Column("kind", _STR(length=32), nullable=False),
        sa.Column("target", _STR(length=200), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("action", sa.JSON(), nullable=False),
        sa.Column("effect", sa.JSON(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("state", _STR(length=16), nullable=False),
        sa.Column("source", _STR(length=32), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("decided_at", _TS, nullable=True),
        sa.Column("decided_by", _STR(length=200), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("superseded_by", _STR(length=36), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("recommendations", schema=None) as batch_op:
        batch_op.create_index("ix_recommendations_state", ["state"], unique=False)
        batch_op.create_index("ix_recommendations_target", ["target"], unique=False)
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", _TS, nullable=False),
        sa.Column("actor", _STR(length=200), nullable=False),
        sa.Column("subject", _STR(length=200), nullable=False),
        sa.Column("from_state", _STR(length=16), nullable=True),
        sa.Column("to_state", _STR(length=16), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_subject", ["subject"], unique=False)
    op.create_table(
        "outbox",
        sa.Column("id", _STR(length=36), nullable=False),
        sa.Column("topic", _STR(length=200), nullable=False),
        sa.Column("key", _STR(length=200), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("sent_at", _TS, nullable=True),
        sa.Column("partition", sa.Integer(), nullable=True),
        sa.Column("offset", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("outbox", schema=None) as batch_op:
        batch_op.create_index("ix_outbox_sent_at", ["sent_at"], unique=False)

    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute(_PG_APPEND_ONLY)
    elif dialect == "sqlite":
        for statement in _SQLITE_APPEND_ONLY:
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_update ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    op.drop_table("outbox")
    op.drop_table("audit_log")
    op.drop_table("recommendations")
    op.drop_table("slo_sets")
    op.drop_table("api_keys")
