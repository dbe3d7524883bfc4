"""The audit log refuses TRUNCATE too, and only its owner may change it (issue 10).

Migration 0004's row triggers refuse UPDATE and DELETE, but TRUNCATE fires no row trigger: one statement
emptied the log. A statement-level trigger refuses it. A trigger only binds roles that cannot drop or
disable it, which is exactly the table's owner (and superusers): the application is meant to run as a
role that does not own the schema (`docs/advisor.md`, `deploy/postgres/roles.sql`). Whatever the
deployment granted by default privileges (`deploy/` grants the service role SELECT, INSERT, UPDATE,
DELETE on every table the owner creates), every role but the owner keeps only INSERT and SELECT here.

SQLite has no TRUNCATE (`DELETE FROM audit_log` without WHERE is refused by 0004's trigger) and no roles.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# `audit_log_append_only()` (0004) raises whatever fires it; a statement trigger may use it as well.
_PG_NO_TRUNCATE = """
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
"""

# Grants made by the owner (the migrating role) to anyone else, PUBLIC included, are taken back except
# INSERT and SELECT. aclexplode lists every grantee, unlike information_schema, which shows only the
# grants that concern the current role.
_PG_ONLY_INSERT_SELECT = """
DO $$
DECLARE
    grantee_name text;
BEGIN
    REVOKE UPDATE, DELETE, TRUNCATE, TRIGGER, REFERENCES ON audit_log FROM PUBLIC;
    FOR grantee_name IN
        SELECT DISTINCT pg_get_userbyid(acl.grantee)
        FROM pg_class AS c, aclexplode(c.relacl) AS acl
        WHERE c.oid = 'audit_log'::regclass
          AND acl.grantee <> 0
          AND acl.grantee <> c.relowner
          AND acl.privilege_type IN ('UPDATE', 'DELETE', 'TRUNCATE', 'TRIGGER', 'REFERENCES')
    LOOP
        EXECUTE format(
            'REVOKE UPDATE, DELETE, TRUNCATE, TRIGGER, REFERENCES ON audit_log FROM %I', grantee_name
        );
    END LOOP;
END
$$;
"""


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_NO_TRUNCATE)
        op.execute(_PG_ONLY_INSERT_SELECT)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_no_truncate ON audit_log")
