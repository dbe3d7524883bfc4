"""The append-only audit log: every state change of a recommendation, every SLO change, every key
created or revoked, with who did it, when, from which state to which, and why.

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
    actor: str,
    subject: str,
    from_state: str | None,
    to_state: str | None,
    reason: str | None = None,
    ts: datetime | None = None,
) -> AuditEntry:
    entry = AuditEntry(ts=ts or utcnow(), actor=actor, subject=subject, reason=reason)
    entry.from_state, entry.to_state = from_state, to_state
    session.add(entry)
    return entry


def entries(
    session: Session, *, subject: str | None = None, limit: int = 100, offset: int = 0
) -> tuple[int, list[AuditEntry]]:
    """Newest first, with the total count for paging."""
    query = select(AuditEntry)
    count = select(func.count()).select_from(AuditEntry)
    if subject is not None:
        query = query.where(AuditEntry.subject == subject)
        count = count.where(AuditEntry.subject == subject)
    query = query.order_by(col(AuditEntry.id).desc()).offset(offset).limit(limit)
    return session.exec(count).one(), list(session.exec(query))
