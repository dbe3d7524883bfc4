"""Creating and revoking API keys, each recorded in the audit log."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine

from advisor import audit_log
from advisor.auth import Role, any_key_exists, create_key, revoke_key
from advisor.records import ApiKey
from twin.db import session_scope
from twin.limits import is_storable_text


def _unstorable(value: str, column: str) -> str | None:
    """Why the store cannot hold `value` in api_keys' `column`, None when it can."""
    most = next(m.max_length for m in ApiKey.model_fields[column].metadata if hasattr(m, "max_length"))
    if len(value) > most:
        return f"is {len(value):,} characters long: at most {most}"
    if not is_storable_text(value):
        return "holds a character no database stores (NUL, or half of a surrogate pair)"
    return None


def key_name_problem(name: str) -> str | None:
    """Why the store cannot hold `name` as a key's name, None when it can."""
    return _unstorable(name, "name")


def key_cluster_problem(cluster_id: str) -> str | None:
    """Why `cluster_id` cannot be a key's cluster (bounded as FINETWIN_CLUSTER_ID is), None when it can."""
    if not cluster_id:
        return "is empty: give the cluster's id (its API's FINETWIN_CLUSTER_ID), or leave it out for all"
    return _unstorable(cluster_id, "cluster_id")


def create_api_key(
    engine: Engine, role: Role, *, name: str, actor: str, cluster_id: str | None = None,
    expires_at: datetime | None = None,
) -> str:  # fmt: skip
    """A new key (returned once: only its hash is kept), for one cluster's API or (None) every cluster's.
    Raises ValueError for a name or cluster the store cannot hold (`key_name_problem`,
    `key_cluster_problem`). Its audit entry is the cluster's, or the store's."""
    problem = key_name_problem(name)
    if problem is not None:
        raise ValueError(f"the key's name {problem}")
    problem = key_cluster_problem(cluster_id) if cluster_id is not None else None
    if problem is not None:
        raise ValueError(f"the key's cluster {problem}")
    with session_scope(engine) as session:
        row, key = create_key(session, role, name, cluster_id, expires_at)
        subject = f"api_key:{row.key_id}"
        audit_log.record(
            session,
            cluster_id=cluster_id,
            actor=actor,
            subject=subject,
            from_state=None,
            to_state=role,
            reason=name if expires_at is None else f"{name} (expires {expires_at:%Y-%m-%d %H:%M:%S} UTC)",
        )
    return key


def revoke_api_key(engine: Engine, key_id: str, *, actor: str) -> bool:
    with session_scope(engine) as session:
        row = session.get(ApiKey, key_id)
        revoked = revoke_key(session, key_id)
        if revoked:
            audit_log.record(
                session, cluster_id=row.cluster_id if row else None, actor=actor, subject=f"api_key:{key_id}",
                from_state="active", to_state="revoked",
            )  # fmt: skip
    return revoked


def ensure_first_key(engine: Engine, *, role: Role = Role.APPROVER, name: str = "first key") -> str | None:
    """On a store without any active key, create one and return it (for `finetwin up` to print once);
    otherwise None: the keys already handed out keep working."""
    with session_scope(engine) as session:
        if any_key_exists(session):
            return None
    return create_api_key(engine, role, name=name, actor="finetwin up")
