"""Sweeps and ensembles on a real Ray head (a subprocess on loopback, 2 CPUs): the same bytes as the local
pool, failing tasks retried then reported, and `finetwin plan --ray`."""

from __future__ import annotations

import json
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

import tests.twin.capacity_cases as cases
from finetwin.cli import main
from tests.twin.capacity_cases import FailingTask, mixed_sweep, narrowed
from tests.twin.conftest import A100
from twin.capacity import run_sweep, without_timings
from twin.executors import LocalExecutor, RayExecutor
from twin.forecast import ForecastOptions, forecast

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _ship_test_code_by_value() -> None:
    """Ray workers import finetwin's packages from the installed venv, but not the tests: the failing task
    defined here travels by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(cases)
    cloudpickle.register_pickle_by_value(sys.modules["tests.twin.conftest"])


def test_a_sweep_on_ray_gives_the_same_bytes_as_the_local_pool(ray_address: str) -> None:
    inputs, models, request, slos = mixed_sweep()
    local = run_sweep(inputs, models, request, slos, LocalExecutor(2))
    on_ray = run_sweep(inputs, models, request, slos, RayExecutor(ray_address))
    assert local["executor"] == "local" and on_ray["executor"] == "ray"
    assert json.dumps(without_timings(on_ray)) == json.dumps(without_timings(local))
    assert on_ray["cheapest"] is not None and on_ray["tasks"] == 48


def test_a_failing_task_on_ray_is_retried_then_reported_by_scenario(ray_address: str, tmp_path: Path) -> None:
    inputs, models, request, slos = mixed_sweep()
    request = narrowed(request, vary=[f"{A100}=1..2", "L40S=1..1"], admissions=["off"], runs=2)
    clean = run_sweep(inputs, models, request, slos, LocalExecutor(1))
    flaky = run_sweep(
        inputs,
        models,
        request,
        slos,
        RayExecutor(ray_address),
        task_fn=FailingTask(str(tmp_path), flaky=True),
    )
    assert len(list(tmp_path.iterdir())) == flaky["tasks"]  # each failed once, on a Ray worker
    assert without_timings(flaky) == without_timings(clean)

    raising = FailingTask(str(tmp_path), broken=1)
    doc = run_sweep(inputs, models, request, slos, RayExecutor(ray_address), task_fn=raising)
    assert [f["scenario"] for f in doc["failed"]] == [1]
    assert "broken on purpose" in doc["failed"][0]["error"]
    dying = FailingTask(str(tmp_path), broken=2, die=True)  # the worker process exits: no hang
    doc = run_sweep(inputs, models, request, slos, RayExecutor(ray_address), task_fn=dying)
    assert [f["scenario"] for f in doc["failed"]] == [2]
    assert doc["scenarios"][0]["slos"] == clean["scenarios"][0]["slos"]


def test_a_forecast_ensemble_on_ray_equals_the_local_one(ray_address: str) -> None:
    inputs, models, _request, slos = mixed_sweep()
    options = ForecastOptions(horizon_s=6 * 3600.0, runs=6, seed=3, workers=1)
    local = forecast(inputs, models, options, slos)
    on_ray = forecast(inputs, models, options.with_changes(ray_address=ray_address), slos)
    for key in ("summary", "series", "slos"):
        assert json.dumps(on_ray[key]) == json.dumps(local[key])


def test_a_whatif_on_ray_equals_the_local_one(ray_address: str) -> None:
    from twin.whatif import WhatIf, run_whatif

    inputs, models, _request, slos = mixed_sweep()
    whatif = WhatIf.model_validate(
        {"horizon": "6h", "runs": 5, "seed": 2, "changes": {"nodes": [{"gpu_model": A100, "add": 1}]}}
    )
    local = run_whatif(inputs, models, whatif, slos, workers=1)
    on_ray = run_whatif(inputs, models, whatif, slos, ray_address=ray_address)
    assert json.dumps(on_ray["difference"]) == json.dumps(local["difference"])
    assert json.dumps(on_ray["scenario"]["summary"]) == json.dumps(local["scenario"]["summary"])


def test_plan_command_with_ray_prints_what_the_local_pool_prints(
    ray_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.twin.test_capacity import CLUSTER, SLO, mmc_inputs
    from twin.workload import write_jobs_csv

    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "slo.yaml").write_text(SLO)
    write_jobs_csv(mmc_inputs(jobs=1000).workload, tmp_path / "jobs.csv")
    files = [str(tmp_path / name) for name in ("c.yaml", "jobs.csv", "slo.yaml")]
    argv = ["plan", "--cluster", files[0], "--workload", files[1], "--slo", files[2],
            "--vary", f"{A100}=2..5", "--runs", "3", "--json"]  # fmt: skip
    assert main([*argv, "--workers", "2"]) == 0
    local = json.loads(capsys.readouterr().out)
    monkeypatch.setenv("FINETWIN_RAY_ADDRESS", ray_address)
    assert main(argv) == 0
    on_ray = json.loads(capsys.readouterr().out)
    assert on_ray["executor"] == "ray"
    assert without_timings(on_ray) == without_timings(local)


def pin_the_twins_clock(engine: Engine) -> None:
    """Telemetry a day ahead of the seed: the twin's clock reads the telemetry (it disagrees with the wall
    clock), so two plans a few seconds apart start from the same instant and the same state. As many events
    as the twin needs to believe telemetry ahead of the wall clock (one alone is a clock running ahead)."""
    from sqlmodel import Session, func, select

    from twin.clock import CORROBORATING_EVENTS
    from twin.db import session_scope
    from twin.store import Job, TelemetryEvent

    with Session(engine) as session:
        seeded = session.exec(select(func.max(Job.updated_at))).one()
    ts = seeded + timedelta(days=1)
    with session_scope(engine) as session:
        for _ in range(CORROBORATING_EVENTS):
            session.add(
                TelemetryEvent(
                    event_id=str(uuid.uuid4()), type="node.status", ts=ts, cluster_id="default",
                    payload={}, received_at=ts,
                )
            )  # fmt: skip


def test_the_api_runs_a_plan_on_ray_when_the_address_is_set(
    ray_address: str, sqlite_url: str, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from finetwin.schema import migrate
    from tests.advisor.conftest import advisor_settings
    from tests.advisor.fakes import FakeInUse, FakeModels
    from tests.advisor.seed import seed_overloaded_cluster
    from tests.conftest import api_app, api_headers, wait_for
    from twin.db import make_engine

    engine = make_engine(sqlite_url)
    migrate(engine)
    seed_overloaded_cluster(engine, jobs=4)
    pin_the_twins_clock(engine)
    operator = api_headers(engine, "operator")
    body = {"vary": [f"{A100}=1..3"], "policies": ["fifo", "backfill"], "runs": 3, "horizon": "6h"}
    documents = {}
    for name, address in (("local", None), ("ray", ray_address)):
        settings = advisor_settings(
            tmp_path / name, forecast_workers=1, forecast_lookback_days=3650, ray_address=address
        )
        app = api_app(settings, engine, FakeInUse(FakeModels()))
        with TestClient(app) as client:
            plan_id = client.post("/v1/plan", json=body, headers=operator).json()["id"]

            def done(client: TestClient = client, plan_id: str = plan_id) -> dict | None:
                plan = client.get(f"/v1/plan/{plan_id}", headers=operator).json()
                return plan if plan["status"] in ("done", "failed") else None

            finished = wait_for(done, 120, f"the plan on {name}")
        assert finished["status"] == "done", finished
        documents[name] = finished["result"]
    assert documents["ray"]["executor"] == "ray"
    assert without_timings(documents["ray"]) == without_timings(documents["local"])
