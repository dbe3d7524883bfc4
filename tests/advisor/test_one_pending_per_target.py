"""At most one pending recommendation per target, under concurrency, on SQLite and PostgreSQL.

Six simultaneous `POST /v1/plan/{id}/recommend` made six pending "capacity" recommendations, none superseded,
and approving each published the same action six times (each with its own message id, so a consumer that
dedupes on it kept all six): `workflow.propose` read what was pending for the target, then inserted, with
nothing between the two (on SQLite the read ran outside any transaction). Steering records its proposals
through the same function.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from advisor import workflow
from advisor.plan_jobs import PlanJob
from advisor.records import OutboxMessage, Recommendation
from tests.advisor.conftest import advisor_settings
from tests.advisor.test_workflow import proposal
from tests.conftest import api_app, api_headers
from twin.db import session_scope

T = TypeVar("T")
AT_ONCE = 6


def all_at_once(work: Callable[[int], T], n: int = AT_ONCE) -> list[T]:
    """`work(i)` on n threads released together by a barrier; their results, in order (a thread's error is
    raised here)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # handed to the test's thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def pending(engine: Engine, target: str) -> list[Recommendation]:
    with Session(engine) as session:
        query = select(Recommendation).where(
            Recommendation.target == target, Recommendation.state == "pending"
        )
        return list(session.exec(query))


def states(engine: Engine, target: str) -> list[str]:
    with Session(engine) as session:
        query = select(Recommendation.state).where(Recommendation.target == target)
        return sorted(session.exec(query))


def outbox(engine: Engine) -> list[OutboxMessage]:
    with Session(engine) as session:
        return list(session.exec(select(OutboxMessage)))


# --- the workflow: what steering records ------------------------------------------------------------------


def test_proposals_for_one_target_at_once_leave_one_pending(engine: Engine) -> None:
    def propose(i: int) -> str:
        with session_scope(engine) as session:
            (rec,) = workflow.propose(
                session,
                [proposal(target="policy", title=f"policy {i}")],
                cluster_id="default",
                actor="system",
                source="schedule",
                ttl=timedelta(hours=1),
            )
            return rec.id

    for _round in range(3):
        all_at_once(propose)
        assert len(pending(engine, "policy")) == 1
    # Every other one was superseded, and says by which.
    assert states(engine, "policy") == ["pending"] + ["superseded"] * (3 * AT_ONCE - 1)


def test_proposals_for_several_targets_in_either_order_do_not_deadlock(engine: Engine) -> None:
    """PostgreSQL: the targets are claimed in one order whatever the order of the proposals."""
    targets = ["nodes:L40S", "policy", "admission", "cap:L40S"]

    def propose(i: int) -> None:
        ordered = targets if i % 2 else list(reversed(targets))
        with session_scope(engine) as session:
            workflow.propose(
                session,
                [proposal(target=t, title=f"{t} {i}") for t in ordered],
                cluster_id="default",
                actor="system",
                source="schedule",
                ttl=timedelta(hours=1),
            )

    all_at_once(propose)
    assert all(len(pending(engine, t)) == 1 for t in targets)


# --- capacity plans over HTTP -----------------------------------------------------------------------------


def done_plan(client: TestClient, gpus: int = 1) -> str:
    """A finished plan, recorded as a sweep leaves one (a sweep itself takes seconds)."""
    plan_id = str(uuid.uuid4())
    result = {
        "confidence": 0.9,
        "runs": 4,
        "cheapest": {
            "nodes": {"L40S": gpus},
            "policy": "fifo",
            "admission": "none",
            "slos": {"p95 wait": {"met_share": 1.0}},
            "gpu_hours_per_day": 24.0 * gpus,
            "energy_kwh_per_day": 10.0 * gpus,
        },
    }
    job = PlanJob(id=plan_id, created_at=datetime.now(UTC), total=1, status="done", done=1, result=result)
    client.app.state.runtime.plan_jobs.add(job)  # type: ignore[attr-defined]
    return plan_id


@pytest.fixture
def api(engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(api_app(advisor_settings(tmp_path), engine)) as client:
        yield client


def test_a_plan_recommended_six_times_at_once_makes_one_recommendation_and_one_action(
    api: TestClient, engine: Engine
) -> None:
    operator, approver = api_headers(engine, "operator"), api_headers(engine, "approver")
    plan_id = done_plan(api)

    answers = all_at_once(lambda _i: api.post(f"/v1/plan/{plan_id}/recommend", headers=operator))

    assert [a.status_code for a in answers] == [200] * AT_ONCE, [a.text for a in answers]
    made = {a.json()["recommendation_id"] for a in answers}
    assert len(made) == 1, made  # the same one for all six
    assert sorted(a.json()["created"] for a in answers) == [False] * (AT_ONCE - 1) + [True]
    (rec,) = pending(engine, "capacity")
    assert rec.id in made and states(engine, "capacity") == ["pending"]
    listed = api.get("/v1/recommendations?state=pending", headers=operator).json()
    assert [r["id"] for r in listed["recommendations"] if r["target"] == "capacity"] == [rec.id]

    # Approving whatever each caller was given publishes the action once.
    decisions = [api.post(f"/v1/recommendations/{a.json()['recommendation_id']}/approve", json={},
                          headers=approver).status_code for a in answers]  # fmt: skip
    assert sorted(decisions) == [200] + [409] * (AT_ONCE - 1)
    (message,) = outbox(engine)
    assert message.key == rec.id and message.payload["effect"]["plan_id"] == plan_id


def test_recommending_a_plan_again_answers_the_pending_recommendation(
    api: TestClient, engine: Engine
) -> None:
    operator = api_headers(engine, "operator")
    plan_id = done_plan(api)
    first = api.post(f"/v1/plan/{plan_id}/recommend", headers=operator)
    again = api.post(f"/v1/plan/{plan_id}/recommend", headers=operator)
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert first.json()["created"] and not again.json()["created"]
    assert again.json()["recommendation_id"] == first.json()["recommendation_id"]
    assert states(engine, "capacity") == ["pending"]
    # Recorded with the plan it came from (the store keeps at most 32 characters of `source`: the plan's id
    # did not fit on PostgreSQL).
    rec = api.get(f"/v1/recommendations/{first.json()['recommendation_id']}", headers=operator).json()
    assert rec["source"] == "capacity plan" and rec["effect"]["plan_id"] == plan_id


def test_plans_recommended_at_once_leave_the_last_one_pending(api: TestClient, engine: Engine) -> None:
    """Another plan's recommendation supersedes the pending one, as before; at once too, one stays."""
    operator = api_headers(engine, "operator")
    plans = [done_plan(api, gpus=i + 1) for i in range(AT_ONCE)]
    answers = all_at_once(lambda i: api.post(f"/v1/plan/{plans[i]}/recommend", headers=operator))
    assert [a.status_code for a in answers] == [200] * AT_ONCE
    assert all(a.json()["created"] for a in answers)
    assert states(engine, "capacity") == ["pending"] + ["superseded"] * (AT_ONCE - 1)


def test_a_plan_whose_recommendation_outlived_its_ttl_is_recommended_anew(
    api: TestClient, engine: Engine
) -> None:
    """Answering the old one would hand out an id whose approval is refused ("expired")."""
    operator = api_headers(engine, "operator")
    plan_id = done_plan(api)
    first = api.post(f"/v1/plan/{plan_id}/recommend", headers=operator).json()["recommendation_id"]
    with session_scope(engine) as session:
        rec = session.get(Recommendation, first)
        assert rec is not None
        rec.expires_at = datetime.now(UTC) - timedelta(seconds=1)
    again = api.post(f"/v1/plan/{plan_id}/recommend", headers=operator).json()
    assert again["created"] and again["recommendation_id"] != first
    assert [r.id for r in pending(engine, "capacity")] == [again["recommendation_id"]]
