"""The capacity plans waiting to run are bounded: each may be minutes of every core and none can be
cancelled, and an operator's script in a loop queued hours of work with no 429."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor.plan_jobs import MAX_QUEUED_PLANS, PLAN_QUEUE_RETRY_S
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers
from twin.db import make_engine

PLAN = {"vary": ["NVIDIA-A100-SXM4-80GB=1..1"], "runs": 1, "horizon": "1h"}


@pytest.fixture
def store(sqlite_url: str) -> Engine:
    engine = make_engine(sqlite_url)
    migrate(engine)
    seed_overloaded_cluster(engine, jobs=2)
    return engine


@pytest.fixture
def busy_api(store: Engine, tmp_path: Path) -> Iterator[TestClient]:
    """An API whose plan worker is busy until the test ends: every plan posted stays queued."""
    settings = advisor_settings(tmp_path, forecast_workers=1, forecast_lookback_days=3650)
    app = api_app(settings, store, FakeInUse(FakeModels()))
    release = threading.Event()
    with TestClient(app) as client:
        app.state.runtime.plan_jobs.pool.submit(release.wait)  # the one worker, taken
        try:
            yield client
        finally:
            release.set()  # the queued plans are then cancelled as the API stops


def test_a_plan_beyond_the_queue_is_a_429_that_says_when_to_retry(
    busy_api: TestClient, store: Engine
) -> None:
    operator = api_headers(store, "operator")
    queued = [busy_api.post("/v1/plan", json=PLAN, headers=operator) for _ in range(MAX_QUEUED_PLANS)]
    assert [r.status_code for r in queued] == [202] * MAX_QUEUED_PLANS, queued[-1].text
    assert {r.json()["status"] for r in queued} == {"queued"}

    refused = busy_api.post("/v1/plan", json=PLAN, headers=operator)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"] == str(PLAN_QUEUE_RETRY_S)
    detail = refused.json()["detail"]
    assert f"{MAX_QUEUED_PLANS} capacity plans are queued already" in detail and "GET /v1/plan" in detail
    listed = busy_api.get("/v1/plan", headers=operator).json()
    assert len(listed) == MAX_QUEUED_PLANS  # the refused one was not kept

    # Once one of them is no longer waiting (it started), there is room for one more.
    jobs = busy_api.app.state.runtime.plan_jobs  # type: ignore[attr-defined]
    jobs.get(queued[0].json()["id"]).status = "running"
    assert busy_api.post("/v1/plan", json=PLAN, headers=operator).status_code == 202
    assert busy_api.post("/v1/plan", json=PLAN, headers=operator).status_code == 429


def test_plans_posted_at_once_do_not_all_slip_under_the_limit(busy_api: TestClient, store: Engine) -> None:
    operator = api_headers(store, "operator")
    n = MAX_QUEUED_PLANS + 4
    barrier = threading.Barrier(n)
    codes: list[int] = []

    def post() -> None:
        barrier.wait()
        codes.append(busy_api.post("/v1/plan", json=PLAN, headers=operator).status_code)

    threads = [threading.Thread(target=post) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes) == [202] * MAX_QUEUED_PLANS + [429] * (n - MAX_QUEUED_PLANS)


def test_the_429_is_in_the_document(busy_api: TestClient) -> None:
    responses = busy_api.get("/openapi.json").json()["paths"]["/v1/plan"]["post"]["responses"]
    assert "queued already" in responses["429"]["description"]
    assert responses["429"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorOut"
    }
