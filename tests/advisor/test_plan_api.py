"""Capacity plans over HTTP: a background sweep of the live state with progress, its result, and its
cheapest cluster as a recommendation an approver approves."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers, wait_for
from twin.db import make_engine

A100 = "NVIDIA-A100-SXM4-80GB"
WAIT_SLO = {"slos": [{"name": "p95 wait <= 1 h", "metric": "wait_p95_s", "max": 3600}]}


@pytest.fixture
def store(sqlite_url: str) -> Engine:
    engine = make_engine(sqlite_url)
    migrate(engine)
    seed_overloaded_cluster(engine, jobs=6)  # 6 jobs of a node each, queued for up to 30 min, 1 node
    return engine


@pytest.fixture
def app_client(store: Engine, tmp_path: Path):  # type: ignore[no-untyped-def]
    # Six submissions over ten years of history: the live arrival process is (nearly) silent, so the
    # answer does not hang on whether a job happens to arrive in the horizon.
    settings = advisor_settings(tmp_path, forecast_workers=1, forecast_lookback_days=3650)
    app = api_app(settings, store, FakeInUse(FakeModels()))
    with TestClient(app) as client:
        yield client


def finished(client: TestClient, plan_id: str, headers: dict[str, str]) -> dict:
    def done() -> dict | None:
        body = client.get(f"/v1/plan/{plan_id}", headers=headers).json()
        return body if body["status"] in ("done", "failed") else None

    return wait_for(done, timeout_s=120, what="the plan to finish")


def test_a_plan_runs_in_the_background_and_its_cheapest_cluster_is_approved(
    app_client: TestClient, store: Engine
) -> None:
    operator, viewer = api_headers(store, "operator"), api_headers(store, "viewer")
    approver = api_headers(store, "approver")
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
    body = {"vary": [f"{A100}=3..7"], "policies": ["fifo", "backfill"], "runs": 2, "horizon": "12h",
            "chunk_runs": 1}  # fmt: skip
    assert app_client.post("/v1/plan", json=body, headers=viewer).status_code == 403

    started = app_client.post("/v1/plan", json=body, headers=operator)
    assert started.status_code == 202, started.text
    plan = started.json()
    assert plan["status"] in ("queued", "running", "done") and plan["progress"]["total"] == 20
    result = finished(app_client, plan["id"], viewer)
    assert result["status"] == "done", result
    assert result["progress"] == {"done": 20, "total": 20}
    doc = result["result"]
    assert doc["executor"] == "local" and len(doc["scenarios"]) == 10
    meets = [(s["nodes"][A100], s["meets_slos"]) for s in doc["scenarios"]]
    # The queued jobs have waited up to 30 min and run for more than an hour each: the SLO holds only
    # when every one of them starts at once, one node each.
    smallest = min((n for n, ok in meets if ok), default=None)
    assert smallest == 6, meets
    assert all(ok == (n >= smallest) for n, ok in meets)
    assert doc["cheapest"]["nodes"] == {A100: smallest}
    listed = app_client.get("/v1/plan", headers=viewer).json()
    assert [p["id"] for p in listed] == [plan["id"]] and listed[0]["result"] is None

    assert app_client.post(f"/v1/plan/{plan['id']}/recommend", headers=viewer).status_code == 403
    made = app_client.post(f"/v1/plan/{plan['id']}/recommend", headers=operator)
    assert made.status_code == 200, made.text
    rec_id = made.json()["recommendation_id"]
    rec = app_client.get(f"/v1/recommendations/{rec_id}", headers=viewer).json()
    assert rec["state"] == "pending" and rec["kind"] == "capacity"
    assert rec["action"]["nodes"] == {A100: smallest}
    assert rec["cost"] == doc["cheapest"]["gpu_hours_per_day"]
    approved = app_client.post(f"/v1/recommendations/{rec_id}/approve", json={}, headers=approver)
    assert approved.status_code == 200, approved.text
    assert approved.json()["state"] == "approved"


def test_bad_plans_are_refused_with_a_reason(app_client: TestClient, store: Engine) -> None:
    operator = api_headers(store, "operator")
    bad = app_client.post("/v1/plan", json={"vary": [f"{A100}=4..1"]}, headers=operator)
    assert bad.status_code == 422 and "empty" in bad.json()["detail"]
    typo = app_client.post("/v1/plan", json={"vary": ["A100-SMX=1..3"]}, headers=operator)
    assert typo.status_code == 422 and "unknown GPU model 'A100-SMX'" in typo.json()["detail"], typo.text
    many = app_client.post("/v1/plan", json={"vary": [f"{A100}=0..99", "L40S=0..99"]}, headers=operator)
    assert many.status_code == 422 and "narrow the ranges" in many.json()["detail"]
    runs = app_client.post("/v1/plan", json={"vary": [f"{A100}=1..2"], "runs": 1000}, headers=operator)
    assert runs.status_code == 422
    cluster = {"vary": [f"{A100}=1..2"], "cluster": {"nodes": [{"gpu_model": A100, "count": -1}]}}
    assert app_client.post("/v1/plan", json=cluster, headers=operator).status_code == 422
    assert app_client.get("/v1/plan/nope", headers=operator).status_code == 404
    assert app_client.post("/v1/plan/nope/recommend", headers=operator).status_code == 404


def test_a_plan_without_a_cluster_in_the_store_says_so(sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    app = api_app(advisor_settings(tmp_path), engine)
    with TestClient(app) as client:
        response = client.post(
            "/v1/plan", json={"vary": [f"{A100}=1..2"]}, headers=api_headers(engine, "operator")
        )
    assert response.status_code == 409


def test_an_unreachable_ray_cluster_is_a_503_for_forecasts_and_a_failed_plan(
    store: Engine, tmp_path: Path
) -> None:
    from ingest.broker import free_port

    pytest.importorskip("ray")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    settings = advisor_settings(tmp_path, forecast_workers=1, forecast_runs=2, ray_address=address)
    app = api_app(settings, store, FakeInUse(FakeModels()))
    operator = api_headers(store, "operator")
    with TestClient(app) as client:
        forecast = client.get("/v1/forecast", headers=operator)
        assert forecast.status_code == 503 and address in forecast.json()["detail"]
        started = client.post("/v1/plan", json={"vary": [f"{A100}=1..2"], "runs": 1}, headers=operator)
        plan = finished(client, started.json()["id"], operator)
    assert plan["status"] == "failed" and "cannot reach the Ray cluster" in plan["error"]


def test_a_plan_running_when_the_api_stops_stops_after_its_tasks_in_flight(
    store: Engine, tmp_path: Path
) -> None:
    """A sweep can take minutes: stopping the API does not wait for all of it, and says so in the plan."""
    settings = advisor_settings(tmp_path, forecast_workers=2, forecast_lookback_days=3650)
    app = api_app(settings, store, FakeInUse(FakeModels()))
    with TestClient(app) as client:
        operator = api_headers(store, "operator")
        assert client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
        body = {"vary": [f"{A100}=1..8"], "policies": ["fifo", "backfill"], "runs": 64, "horizon": "12h",
                "chunk_runs": 1}  # fmt: skip
        started = client.post("/v1/plan", json=body, headers=operator)
        assert started.status_code == 202, started.text
        job = app.state.runtime.plan_jobs.get(started.json()["id"])
        wait_for(lambda: job.done > 0, timeout_s=120, what="the plan's first tasks")
    # Leaving the client stopped the app, which waited for the plan to stop.
    assert job.status == "failed", (job.status, job.done, job.total)
    assert job.error == "stopped: the API stopped before the plan finished"
    assert 0 < job.done < job.total == 8 * 2 * 64
