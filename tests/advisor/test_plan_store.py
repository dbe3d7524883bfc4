"""Capacity plans are kept in the store: a plan and its result outlive the API process that ran it (a deploy,
a crash), every API process of the store answers about every plan, and a plan whose process died is said to
be lost, not left running for ever. On both backends (`engine`)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor import plan_jobs
from advisor.plan_jobs import LOST_AFTER_S, MAX_KEPT, PlanJob, PlanJobs
from advisor.records import CapacityPlanRecord
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers, wait_for
from twin.db import session_scope
from twin.store import utcnow

A100 = "NVIDIA-A100-SXM4-80GB"
WAIT_SLO = {"slos": [{"name": "p95 wait <= 1 h", "metric": "wait_p95_s", "max": 3600}]}
PLAN = {"vary": [f"{A100}=5..7"], "runs": 2, "horizon": "12h", "chunk_runs": 1}


@pytest.fixture
def store(engine: Engine) -> Engine:
    seed_overloaded_cluster(engine, jobs=6)  # 6 jobs of a node each, queued for up to 30 min, 1 node
    return engine


def app_on(store: Engine, tmp_path: Path) -> Any:
    # Six submissions over ten years of history: the live arrival process is (nearly) silent.
    settings = advisor_settings(tmp_path, forecast_workers=1, forecast_lookback_days=3650)
    return api_app(settings, store, FakeInUse(FakeModels()))


def finished(client: TestClient, plan_id: str, headers: dict[str, str]) -> dict:
    def done() -> dict | None:
        body = client.get(f"/v1/plan/{plan_id}", headers=headers).json()
        return body if body["status"] in ("done", "failed") else None

    return wait_for(done, timeout_s=120, what="the plan to finish")


def test_a_plan_and_its_result_outlive_the_api_that_ran_it(store: Engine, tmp_path: Path) -> None:
    operator, viewer = api_headers(store, "operator"), api_headers(store, "viewer")
    with TestClient(app_on(store, tmp_path)) as first:
        assert first.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
        started = first.post("/v1/plan", json=PLAN, headers=operator)
        assert started.status_code == 202, started.text
        plan_id = started.json()["id"]
        ran = finished(first, plan_id, viewer)
    assert ran["status"] == "done", ran

    with TestClient(app_on(store, tmp_path)) as second:  # the API started again on the same store
        again = second.get(f"/v1/plan/{plan_id}", headers=viewer)
        assert again.status_code == 200, again.text
        assert again.json() == ran
        listed = second.get("/v1/plan", headers=viewer).json()
        assert [(p["id"], p["status"], p["result"]) for p in listed] == [(plan_id, "done", None)]
        made = second.post(f"/v1/plan/{plan_id}/recommend", headers=operator)
        assert made.status_code == 200, made.text
        rec = second.get(f"/v1/recommendations/{made.json()['recommendation_id']}", headers=viewer).json()
    assert rec["effect"]["plan_id"] == plan_id
    assert rec["action"]["nodes"] == ran["result"]["cheapest"]["nodes"]


def test_every_api_process_of_the_store_sees_a_plan_and_its_end(store: Engine, tmp_path: Path) -> None:
    operator, viewer = api_headers(store, "operator"), api_headers(store, "viewer")
    release = threading.Event()
    runs = app_on(store, tmp_path / "a")
    with TestClient(runs) as a, TestClient(app_on(store, tmp_path / "b")) as b:
        assert a.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
        runs.state.runtime.plan_jobs.pool.submit(release.wait)  # A's worker busy: its plan waits
        plan_id = a.post("/v1/plan", json=PLAN, headers=operator).json()["id"]
        seen = b.get(f"/v1/plan/{plan_id}", headers=viewer).json()
        assert (seen["status"], seen["progress"]) == ("queued", {"done": 0, "total": 6})
        assert [p["id"] for p in b.get("/v1/plan", headers=viewer).json()] == [plan_id]
        release.set()
        ended = finished(b, plan_id, viewer)
        assert ended == a.get(f"/v1/plan/{plan_id}", headers=viewer).json()
    assert ended["status"] == "done" and ended["progress"] == {"done": 6, "total": 6}
    assert len(ended["result"]["scenarios"]) == 3


def test_a_running_plans_progress_reaches_the_store_while_it_runs(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plan_jobs, "HEARTBEAT_S", 0.05)
    jobs, elsewhere = PlanJobs(store, "default"), PlanJobs(store, "default")
    job = PlanJob(id=str(uuid.uuid4()), created_at=utcnow(), total=10)
    jobs.add(job)
    job.status, job.done = "running", 4  # as the worker leaves it between a task and the next
    try:
        seen = wait_for(
            lambda: (found := elsewhere.get(job.id)).done == 4 and found, what="the progress in the store"
        )
        assert (seen.status, seen.total, seen.error) == ("running", 10, None)
    finally:
        jobs.close()
    assert elsewhere.get(job.id).error == "stopped: the API stopped before the plan finished"


def record(store: Engine, *, status: str, heard: datetime, created: datetime | None = None) -> str:
    """A plan recorded by another API process (`host-b:4242:...`), last heard of at `heard`."""
    plan_id = str(uuid.uuid4())
    with session_scope(store) as session:
        session.add(
            CapacityPlanRecord(
                id=plan_id,
                cluster_id="default",
                created_at=created or heard,
                updated_at=heard,
                status=status,
                done=3,
                total=10,
                owner="host-b:4242:0badf00d",
            )  # fmt: skip
        )
    return plan_id


def test_a_plan_whose_api_process_died_is_said_to_be_lost(store: Engine, tmp_path: Path) -> None:
    now = utcnow()
    silent = now - timedelta(seconds=2 * LOST_AFTER_S)
    dead = record(store, status="running", heard=silent)
    alive = record(store, status="running", heard=now)
    never_started = record(store, status="queued", heard=silent)
    viewer = api_headers(store, "viewer")
    with TestClient(app_on(store, tmp_path)) as client:
        lost = client.get(f"/v1/plan/{dead}", headers=viewer).json()
        running = client.get(f"/v1/plan/{alive}", headers=viewer).json()
        listed = {p["id"]: p["status"] for p in client.get("/v1/plan", headers=viewer).json()}
        queued = client.get(f"/v1/plan/{never_started}", headers=viewer).json()
    assert lost["status"] == "failed" and lost["progress"] == {"done": 3, "total": 10}
    assert lost["error"] == (
        "lost: the API process that ran it (host-b:4242:0badf00d) stopped without finishing it; last heard "
        f"of {silent.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    )
    assert running["status"] == "running" and running["error"] is None
    assert queued["status"] == "failed" and queued["error"].startswith("lost: ")
    assert listed == {dead: "failed", alive: "running", never_started: "failed"}


def test_plans_queued_when_the_api_stops_are_failed_saying_why(store: Engine, tmp_path: Path) -> None:
    operator = api_headers(store, "operator")
    app = app_on(store, tmp_path)
    release = threading.Event()
    with TestClient(app) as client:
        pool = app.state.runtime.plan_jobs.pool
        pool.submit(release.wait)  # the worker busy until the API stops
        plan_id = client.post("/v1/plan", json=PLAN, headers=operator).json()["id"]
        shutdown = pool.shutdown

        def stopping(wait: bool = True, *, cancel_futures: bool = False) -> None:
            shutdown(wait=False, cancel_futures=cancel_futures)  # the queued plan cancelled, never started
            release.set()
            shutdown(wait=wait)

        pool.shutdown = stopping
    # Another process of the store reads what the stopped one recorded.
    job = PlanJobs(store, "default").get(plan_id)
    assert (job.status, job.error) == ("failed", "stopped: the API stopped before the plan started")


def test_the_store_keeps_the_newest_plans_and_those_still_running(store: Engine) -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    running_elsewhere = record(store, status="running", heard=utcnow(), created=start - timedelta(days=1))
    dead_elsewhere = record(store, status="running", heard=start, created=start - timedelta(days=1))
    jobs = PlanJobs(store, "default")
    ids = []
    for k in range(MAX_KEPT + 3):
        job = PlanJob(id=str(uuid.uuid4()), created_at=start + timedelta(minutes=k), total=1, status="done")
        jobs.add(job)
        ids.append(job.id)
    jobs.close()
    kept = {j.id for j in PlanJobs(store, "default").newest()}
    with session_scope(store) as session:
        recorded = {row.id for row in session.query(CapacityPlanRecord)}
    assert recorded == set(ids[3:]) | {running_elsewhere}
    assert dead_elsewhere not in recorded
    assert kept == set(
        ids[3:]
    )  # the newest MAX_KEPT are listed; the old plan still running is not among them


def test_a_plans_end_the_store_could_not_take_is_written_by_the_next_heartbeat(
    store: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    monkeypatch.setattr(plan_jobs, "HEARTBEAT_S", 0.05)
    jobs = PlanJobs(store, "default")
    job = PlanJob(id=str(uuid.uuid4()), created_at=utcnow(), total=2)
    jobs.add(job)
    write, refusals = jobs._update, [OperationalError("UPDATE", {}, Exception("database is locked"))]

    def store_away_once(batch: list[tuple[str, dict]]) -> None:
        if refusals and any(fields["status"] == "done" for _, fields in batch):
            raise refusals.pop()
        write(batch)

    monkeypatch.setattr(jobs, "_update", store_away_once)
    job.status, job.done, job.result = "done", 2, {"cheapest": None}
    jobs.save(job)  # refused: logged, and kept to write again
    assert not refusals and job.id in jobs.jobs
    try:
        seen = wait_for(
            lambda: (found := PlanJobs(store, "default").get(job.id)).status == "done" and found,
            what="the plan's end in the store",
        )
        wait_for(lambda: job.id not in jobs.jobs, what="the written plan to leave the process's memory")
    finally:
        jobs.close()
    assert (seen.done, seen.result) == (2, {"cheapest": None})
