"""The append-only audit log: every state change of a recommendation, every SLO change, every key
created or revoked, with who did it, when, from which state to which, and why.

An entry about a recommendation or an SLO set is of its cluster; one about a key is the store's (keys work on
every cluster's API). Each API shows its cluster's entries and the store's (`entries`).

Entries are only ever added, in the same transaction as the change they record (so neither exists
without the other); the database refuses UPDATE and DELETE on the table (migration 0004).
"""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, func, select

from advisor.records import AuditEntry
from twin.store import utcnow

SYSTEM_ACTOR = "system"


def record(
    session: Session,
    *,
    cluster_id: str | None,
    actor: str,
    subject: str,
    from_state: str | None,
    to_state: str | None,
    reason: str | None = None,
    ts: datetime | None = None,
) -> AuditEntry:
    entry = AuditEntry(cluster_id=cluster_id, ts=ts or utcnow(), actor=actor, subject=subject, reason=reason)
    entry.from_state, entry.to_state = from_state, to_state
    session.add(entry)
    return entry


def entries(
    session: Session, cluster_id: str, *, subject: str | None = None, limit: int = 100, offset: int = 0
) -> tuple[int, list[AuditEntry]]:
    """The cluster's entries and the store's (`cluster_id` None), newest first, with the total count for
    paging."""
    shown = (col(AuditEntry.cluster_id) == cluster_id) | col(AuditEntry.cluster_id).is_(None)
    query = select(AuditEntry).where(shown)
    count = select(func.count()).select_from(AuditEntry).where(shown)
    if subject is not None:
        query = query.where(AuditEntry.subject == subject)
        count = count.where(AuditEntry.subject == subject)
    query = query.order_by(col(AuditEntry.id).desc()).offset(offset).limit(limit)
    return session.exec(count).one(), list(session.exec(query))
