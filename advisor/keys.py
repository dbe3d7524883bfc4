"""Creating and revoking API keys, each recorded in the audit log."""

from __future__ import annotations

from sqlalchemy import Engine

from advisor import audit_log
from advisor.auth import Role, any_key_exists, create_key, revoke_key
from twin.db import session_scope


def create_api_key(engine: Engine, role: Role, *, name: str, actor: str) -> str:
    """A new key (returned once: only its hash is kept)."""
    with session_scope(engine) as session:
        row, key = create_key(session, role, name)
        subject = f"api_key:{row.key_id}"
        audit_log.record(session, actor=actor, subject=subject, from_state=None, to_state=role, reason=name)
    return key


def revoke_api_key(engine: Engine, key_id: str, *, actor: str) -> bool:
    with session_scope(engine) as session:
        revoked = revoke_key(session, key_id)
        if revoked:
            audit_log.record(
                session, actor=actor, subject=f"api_key:{key_id}", from_state="active", to_state="revoked"
            )
    return revoked


def ensure_first_key(engine: Engine, *, role: Role = Role.APPROVER, name: str = "first key") -> str | None:
    """On a store without any active key, create one and return it (for `finetwin up` to print once);
    otherwise None: the keys already handed out keep working."""
    with session_scope(engine) as session:
        if any_key_exists(session):
            return None
    return create_api_key(engine, role, name=name, actor="finetwin up")
