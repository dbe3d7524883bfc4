"""The recommendation life cycle and its audit trail, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlmodel import Session, col, select

from advisor import workflow
from advisor.records import AuditEntry, OutboxMessage, Recommendation
from twin.db import session_scope
from twin.store import utcnow


def proposal(target: str = "nodes:A100-SXM", title: str = "add 1 A100-SXM node") -> workflow.Proposal:
    return workflow.Proposal(
        kind="add_nodes",
        target=target,
        title=title,
        action={"gpu_model": "A100-SXM", "delta_nodes": 1},
        effect={"metric": "slo_attainment", "delta": 0.1, "low": 0.05, "high": 0.15},
        cost=192.0,
        score=0.1 / 192.0,
    )


def propose(
    engine: Engine,
    *props: workflow.Proposal,
    ttl: timedelta = timedelta(hours=1),
    cluster_id: str = "default",
) -> list[str]:
    with session_scope(engine) as session:
        recs = workflow.propose(
            session, list(props), cluster_id=cluster_id, actor="system", source="on-demand", ttl=ttl
        )
        return [r.id for r in recs]


def states(engine: Engine) -> dict[str, str]:
    with Session(engine) as session:
        return {r.id: r.state for r in session.exec(select(Recommendation))}


def trail(engine: Engine, rec_id: str) -> list[tuple[str | None, str | None, str]]:
    with Session(engine) as session:
        query = select(AuditEntry).where(AuditEntry.subject == f"recommendation:{rec_id}")
        rows = session.exec(query.order_by(col(AuditEntry.id)))
        return [(e.from_state, e.to_state, e.actor) for e in rows]


def test_a_newer_recommendation_supersedes_the_pending_one_for_its_target(engine: Engine) -> None:
    (first,) = propose(engine, proposal())
    (other,) = propose(engine, proposal(target="policy"))
    (second,) = propose(engine, proposal(title="add 2 A100-SXM nodes"))
    assert states(engine) == {first: "superseded", other: "pending", second: "pending"}
    assert trail(engine, first) == [(None, "pending", "system"), ("pending", "superseded", "system")]
    with Session(engine) as session:
        assert session.get(Recommendation, first).superseded_by == second  # type: ignore[union-attr]


def test_approval_and_its_outbox_message_commit_together(engine: Engine) -> None:
    (rec_id,) = propose(engine, proposal())
    with session_scope(engine) as session:
        workflow.approve(
            session, "default", rec_id, actor="key:abc (alice)", comment="go", actions_topic="actions"
        )
    assert states(engine)[rec_id] == "approved"
    assert trail(engine, rec_id)[-1] == ("pending", "approved", "key:abc (alice)")
    with Session(engine) as session:
        (message,) = session.exec(select(OutboxMessage)).all()
    assert message.key == rec_id and message.topic == "actions" and message.sent_at is None
    assert message.payload["recommendation_id"] == rec_id and message.payload["message_id"] == message.id
    assert message.payload["action"] == {"gpu_model": "A100-SXM", "delta_nodes": 1}


def test_a_failed_approval_leaves_no_trace(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    (rec_id,) = propose(engine, proposal())

    def broken_enqueue(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(workflow, "enqueue", broken_enqueue)
    with pytest.raises(RuntimeError), session_scope(engine) as session:
        workflow.approve(
            session, "default", rec_id, actor="key:abc (alice)", comment=None, actions_topic="actions"
        )
    assert states(engine)[rec_id] == "pending"
    assert trail(engine, rec_id) == [(None, "pending", "system")]


def test_decisions_only_from_pending(engine: Engine) -> None:
    (a, b) = propose(engine, proposal(target="t1"), proposal(target="t2"))
    with session_scope(engine) as session:
        workflow.reject(session, "default", a, actor="key:x (bob)", comment="too expensive")
    for decide in (
        lambda s: workflow.approve(
            s, "default", a, actor="key:x (bob)", comment=None, actions_topic="actions"
        ),
        lambda s: workflow.reject(s, "default", a, actor="key:x (bob)", comment="again"),
    ):
        with pytest.raises(workflow.TransitionError) as error, session_scope(engine) as session:
            decide(session)
        assert error.value.status == 409 and "rejected" in error.value.message
    with pytest.raises(workflow.TransitionError) as error, session_scope(engine) as session:
        workflow.reject(session, "default", b, actor="key:x (bob)", comment="   ")
    assert error.value.status == 422
    with pytest.raises(workflow.TransitionError) as error, session_scope(engine) as session:
        workflow.approve(
            session, "default", "nope", actor="key:x (bob)", comment=None, actions_topic="actions"
        )
    assert error.value.status == 404
    assert states(engine) == {a: "rejected", b: "pending"}


def test_pending_recommendations_expire_after_their_ttl(engine: Engine) -> None:
    (old,) = propose(engine, proposal(target="t1"), ttl=timedelta(seconds=-1), cluster_id="lab-a")
    (fresh,) = propose(engine, proposal(target="t2"))
    with pytest.raises(workflow.TransitionError) as error, session_scope(engine) as session:
        workflow.approve(session, "lab-a", old, actor="key:x (bob)", comment=None, actions_topic="actions")
    assert error.value.status == 409 and "expired" in error.value.message
    with session_scope(engine) as session:
        assert workflow.expire_due(session, now=utcnow()) == [old]
    assert states(engine) == {old: "expired", fresh: "pending"}
    assert trail(engine, old)[-1] == ("pending", "expired", "system")
    with Session(engine) as session:  # any API expires what is due, and the entry is of its cluster
        query = select(AuditEntry.cluster_id).where(AuditEntry.subject == f"recommendation:{old}")
        assert set(session.exec(query)) == {"lab-a"}


def test_the_audit_log_is_append_only(engine: Engine) -> None:
    propose(engine, proposal())
    statements = ["UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"]
    if engine.dialect.name == "postgresql":  # no row trigger fires on TRUNCATE: a statement trigger does
        statements.append("TRUNCATE audit_log")
    for statement in statements:
        with pytest.raises(Exception, match="append-only"), engine.begin() as connection:
            connection.execute(text(statement))
    with Session(engine) as session:
        assert [e.actor for e in session.exec(select(AuditEntry))] == ["system"]


def test_approve_and_reject_over_http(engine: Engine, client: TestClient, keys: dict) -> None:
    (a, b) = propose(engine, proposal(target="t1"), proposal(target="t2"))
    approver = keys["approver"]
    approved = client.post(f"/v1/recommendations/{a}/approve", json={"comment": "ok"}, headers=approver)
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "approved" and approved.json()["published"] is False
    no_comment = client.post(f"/v1/recommendations/{b}/reject", json={}, headers=keys["approver"])
    assert no_comment.status_code == 422 and "comment" in no_comment.json()["detail"]
    rejected = client.post(f"/v1/recommendations/{b}/reject", json={"comment": "no"}, headers=approver)
    assert rejected.json()["state"] == "rejected"
    again = client.post(f"/v1/recommendations/{a}/approve", headers=keys["approver"])
    assert again.status_code == 409
    listing = client.get("/v1/recommendations", headers=keys["viewer"]).json()
    assert {r["id"]: r["state"] for r in listing["recommendations"]} == {a: "approved", b: "rejected"}
    audit = client.get("/v1/audit", params={"subject": f"recommendation:{a}"}, headers=keys["viewer"]).json()
    newest = audit["entries"][0]
    assert (newest["from_state"], newest["to_state"], newest["reason"]) == ("pending", "approved", "ok")
    assert newest["actor"].startswith("key:") and "approver-tester" in newest["actor"]
