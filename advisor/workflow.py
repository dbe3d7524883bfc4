"""The life of a recommendation: pending until a person acts.

    pending ──approve──► approved   (+ an outbox message, in the same transaction)
            ──reject───► rejected   (a comment is required)
            ──TTL──────► expired
            ──newer────► superseded (a newer recommendation for the same target)

Every transition is written to the audit log in the transaction that makes it. Transitions are
conditional updates (`... WHERE state = 'pending'`), so two approvers racing cannot both win and a
recommendation that expired a moment ago cannot be approved.

Each recommendation is of one cluster (an API serves one, FINETWIN_CLUSTER_ID, and a store may hold
several): a target is a cluster's, and a recommendation of another cluster is not there to decide (404).
Expiry is by each one's own time to live, so any API expires what is due, whatever its cluster.

At most one recommendation is pending per target: `propose` claims each target (`claim_targets`) before it
reads what is pending there, so two proposals for one target, made at the same moment, are made one after
the other and the second supersedes the first. Without the claim, both read "nothing pending", both were
inserted, and approving each published the same action twice.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, text, update
from sqlmodel import Session, col, select

from advisor import audit_log
from advisor.outbox import enqueue
from advisor.records import Recommendation
from twin.store import utcnow


class State(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    SUPERSEDED = "superseded"


class TransitionError(Exception):
    """A decision that cannot be made: `status` is the HTTP status that says why (404, 409, 422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Proposal:
    """A candidate action worth recommending, with what the twin predicts it does."""

    kind: str
    target: str
    title: str
    action: dict[str, Any]
    effect: dict[str, Any] = field(default_factory=dict)
    cost: float = 1.0
    score: float = 0.0


def subject(recommendation_id: str) -> str:
    return f"recommendation:{recommendation_id}"


def as_utc(ts: datetime) -> datetime:
    """SQLite hands timestamps back without their zone; they were written in UTC."""
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


# PostgreSQL advisory locks of the two-integer form (their key space is apart from the one-integer locks
# finetwin.schema takes): this namespace, then a hash of the target.
_TARGET_LOCK_NAMESPACE = 0x72656373  # "recs"


def _target_lock_key(cluster_id: str, target: str) -> int:
    """A stable signed 32-bit key per cluster's target (Python's hash() differs between processes). Two
    targets that share a key only wait for each other."""
    named = f"{cluster_id}\x00{target}".encode()  # NUL: in neither, so no two pairs name the same
    return int.from_bytes(hashlib.sha256(named).digest()[:4], "big", signed=True)


def claim_targets(session: Session, cluster_id: str, targets: Iterable[str]) -> None:
    """Hold, until the session's transaction ends, the right to change what is pending for the cluster's
    `targets`: a second transaction that claims one of them waits until this one has committed, then reads
    what it wrote.

    A unique index on pending targets would need a migration of the store's schema; a lock needs none and
    works on the schema every store already has. Claiming a target twice in one transaction is harmless."""
    if session.get_bind().dialect.name == "postgresql":
        # Sorted: two transactions claiming the same targets in different orders cannot deadlock.
        for key in sorted({_target_lock_key(cluster_id, t) for t in targets}):
            session.execute(
                text("SELECT pg_advisory_xact_lock(:namespace, :key)"),
                {"namespace": _TARGET_LOCK_NAMESPACE, "key": key},
            )
        return
    # SQLite has one writer at a time. Python's sqlite3 runs a SELECT outside any transaction and begins one
    # only before a write, so the write comes first: this one changes nothing but takes the database's write
    # lock now (waiting for the writer before, up to the connection's busy timeout), and the reads after it
    # see everything committed before.
    session.execute(
        update(Recommendation).where(col(Recommendation.id) == "").values(state=col(Recommendation.state))
    )


def _pending(cluster_id: str, target: str) -> ColumnElement[bool]:
    """The condition of what is pending for the cluster's `target`."""
    return (
        (col(Recommendation.target) == target)
        & (col(Recommendation.cluster_id) == cluster_id)
        & (col(Recommendation.state) == State.PENDING.value)
    )


def pending_for(
    session: Session, cluster_id: str, target: str, *, now: datetime | None = None
) -> Recommendation | None:
    """The recommendation pending for the cluster's `target` (at most one: see `claim_targets`), unless its
    time to live has passed (it is as good as expired: an approval would be refused)."""
    query = select(Recommendation).where(
        _pending(cluster_id, target),
        col(Recommendation.expires_at) > (now or utcnow()),
    )
    return session.exec(query.order_by(col(Recommendation.created_at).desc())).first()


def propose(
    session: Session,
    proposals: list[Proposal],
    *,
    cluster_id: str,
    actor: str,
    source: str,
    ttl: timedelta,
    now: datetime | None = None,
) -> list[Recommendation]:
    """Record new pending recommendations for the cluster; each supersedes the pending one for its target."""
    claim_targets(session, cluster_id, [p.target for p in proposals])
    now = now or utcnow()
    created: list[Recommendation] = []
    for proposal in proposals:
        rec = Recommendation(
            id=str(uuid.uuid4()),
            cluster_id=cluster_id,
            kind=proposal.kind,
            target=proposal.target,
            title=proposal.title,
            action=proposal.action,
            effect=proposal.effect,
            cost=proposal.cost,
            score=proposal.score,
            state=State.PENDING.value,
            source=source,
            created_at=now,
            expires_at=now + ttl,
        )
        older = session.exec(select(Recommendation.id).where(_pending(cluster_id, proposal.target))).all()
        for old_id in older:
            if _transition(session, old_id, State.SUPERSEDED, now=now, superseded_by=rec.id):
                audit_log.record(
                    session,
                    cluster_id=cluster_id,
                    actor=actor,
                    subject=subject(old_id),
                    from_state=State.PENDING.value,
                    to_state=State.SUPERSEDED.value,
                    reason=f"superseded by {rec.id}",
                    ts=now,
                )
        session.add(rec)
        audit_log.record(
            session,
            cluster_id=cluster_id,
            actor=actor,
            subject=subject(rec.id),
            from_state=None,
            to_state=State.PENDING.value,
            reason=f"{source}: {proposal.title}",
            ts=now,
        )
        created.append(rec)
    session.flush()
    return created


def approve(
    session: Session,
    cluster_id: str,
    recommendation_id: str,
    *,
    actor: str,
    comment: str | None,
    actions_topic: str,
    now: datetime | None = None,
) -> Recommendation:
    """Approve a pending recommendation of the cluster and queue its action for `actions_topic`, in one
    transaction. The message names the cluster: every cluster's actions share the topic."""
    now = now or utcnow()
    rec = _decide(
        session, cluster_id, recommendation_id, State.APPROVED, actor=actor, comment=comment, now=now
    )
    enqueue(
        session,
        topic=actions_topic,
        key=rec.id,
        payload={
            "recommendation_id": rec.id,
            "cluster_id": rec.cluster_id,
            "kind": rec.kind,
            "target": rec.target,
            "title": rec.title,
            "action": rec.action,
            "effect": rec.effect,
            "approved_by": actor,
            "approved_at": now.isoformat(),
            "comment": comment,
        },
        now=now,
    )
    return rec


def reject(
    session: Session,
    cluster_id: str,
    recommendation_id: str,
    *,
    actor: str,
    comment: str,
    now: datetime | None = None,
) -> Recommendation:
    if not comment or not comment.strip():
        raise TransitionError(422, "a rejection needs a comment saying why")
    return _decide(
        session, cluster_id, recommendation_id, State.REJECTED, actor=actor, comment=comment.strip(), now=now
    )


def expire_due(session: Session, *, now: datetime | None = None) -> list[str]:
    """Expire every pending recommendation past its TTL; returns their ids."""
    now = now or utcnow()
    due = session.exec(
        select(Recommendation.id, Recommendation.cluster_id).where(
            Recommendation.state == State.PENDING.value, col(Recommendation.expires_at) <= now
        )
    ).all()
    expired = []
    for rec_id, cluster_id in due:
        if _transition(session, rec_id, State.EXPIRED, now=now):
            audit_log.record(
                session,
                cluster_id=cluster_id,
                actor=audit_log.SYSTEM_ACTOR,
                subject=subject(rec_id),
                from_state=State.PENDING.value,
                to_state=State.EXPIRED.value,
                reason="not decided within its time to live",
                ts=now,
            )
            expired.append(rec_id)
    return expired


def of_cluster(session: Session, cluster_id: str, recommendation_id: str) -> Recommendation | None:
    """The recommendation, if it is the cluster's: another cluster's is not this API's to show or decide."""
    rec = session.get(Recommendation, recommendation_id)
    return rec if rec is not None and rec.cluster_id == cluster_id else None


def not_found(cluster_id: str, recommendation_id: str) -> str:
    return f"no recommendation {recommendation_id!r} in cluster {cluster_id!r}"


def _decide(
    session: Session,
    cluster_id: str,
    recommendation_id: str,
    to: State,
    *,
    actor: str,
    comment: str | None,
    now: datetime | None,
) -> Recommendation:
    now = now or utcnow()
    rec = of_cluster(session, cluster_id, recommendation_id)
    if rec is None:
        raise TransitionError(404, not_found(cluster_id, recommendation_id))
    if rec.state == State.PENDING.value and as_utc(rec.expires_at) <= now:
        raise TransitionError(409, f"recommendation {recommendation_id} expired at {rec.expires_at}")
    changed = _transition(session, recommendation_id, to, now=now, actor=actor, comment=comment)
    if not changed:
        session.refresh(rec)
        raise TransitionError(409, f"recommendation {recommendation_id} is {rec.state}, not pending")
    audit_log.record(
        session,
        cluster_id=cluster_id,
        actor=actor,
        subject=subject(recommendation_id),
        from_state=State.PENDING.value,
        to_state=to.value,
        reason=comment,
        ts=now,
    )
    session.refresh(rec)
    return rec


def _transition(
    session: Session,
    recommendation_id: str,
    to: State,
    *,
    now: datetime,
    actor: str | None = None,
    comment: str | None = None,
    superseded_by: str | None = None,
) -> bool:
    """Move one recommendation out of `pending`; False when it was no longer pending."""
    values: dict[str, Any] = {"state": to.value, "decided_at": now}
    if actor is not None:
        values["decided_by"] = actor
    if comment is not None:
        values["comment"] = comment
    if superseded_by is not None:
        values["superseded_by"] = superseded_by
    result = session.execute(
        update(Recommendation)
        .where(col(Recommendation.id) == recommendation_id, col(Recommendation.state) == State.PENDING.value)
        .values(**values)
    )
    return result.rowcount == 1  # type: ignore[attr-defined]
