"""The twin on the real store (SQLite and PostgreSQL): live inputs, stored forecasts, and the HTTP API."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from finetwin.schema import migrate
from finetwin.settings import Settings
from tests.conftest import api_headers, api_parts
from tests.twin.query_plans import sqlite_plans
from twin.capacity import SweepRequest, prepare_inputs
from twin.db import make_engine, session_scope
from twin.forecast import ForecastOptions, forecast, models_for
from twin.forecast_store import STANDING, latest_forecast, save_forecast
from twin.live_state import NoClusterError, load_live_inputs
from twin.policies import Policy
from twin.protocols import JobModels
from twin.slo_attainment import DEFAULT_SLOS
from twin.store import Job, Node, ObservedRun
from twin.uncalibrated import FALLBACK_LABEL, FallbackModels
from twin.whatif import ScenarioChanges, apply_changes

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"


def job(job_id: str, state: str, submitted: datetime, **fields: object) -> Job:
    config = {"model_name": "llama3-8b", "method": "lora", "gpu_model": A100, "number_gpus": 2,
              "number_nodes": 1, "batch_size": 16, "tokens_per_sample": 1024,
              "dataset_tokens": 2e7}  # fmt: skip
    return Job(job_id=job_id, state=state, submitted_at=submitted, updated_at=submitted, **(config | fields))


def populate(engine: Engine, now: datetime = NOW) -> None:
    with session_scope(engine) as session:
        for k in range(3):
            session.add(Node(node_id=f"n{k}", gpu_model=A100, gpu_count=8, status="up", updated_at=now))
        session.add(Node(node_id="n-down", gpu_model="L40S", gpu_count=8, status="down", updated_at=now))
        # History: two days of submissions, every hour, the ones before today ended.
        for h in range(48):
            ts = now - timedelta(hours=48 - h)
            state = "completed" if h % 5 else "failed"
            extra: dict[str, object] = {"ended_at": ts + timedelta(minutes=30)}
            if state == "failed":
                extra |= {"failed_after_s": 120.0 + h, "outcome": "runtime"}
            session.add(job(f"old-{h}", state, ts, **extra))
        session.add(job("old-no-work", "completed", now - timedelta(hours=3), dataset_tokens=None))
        session.flush()
        session.add(ObservedRun(job_id="old-no-work", is_valid=1, observed_at=now, train_runtime=100.0,
                                dataset_tokens_per_second=1000.0))  # fmt: skip
        session.add(job("queued-1", "submitted", now - timedelta(minutes=20)))
        session.add(job("queued-nocfg", "submitted", now - timedelta(minutes=10), model_name=None))
        session.add(job("running-1", "running", now - timedelta(minutes=40),
                        started_at=now - timedelta(minutes=30), tokens_processed=1e7,
                        last_tokens_per_second=5000.0, last_power_watts=287.5))  # fmt: skip


def test_live_inputs_from_the_store(engine: Engine) -> None:
    with pytest.raises(NoClusterError):
        load_live_inputs(engine, now=NOW)
    populate(engine)
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=2))
    assert inputs.cluster.gpus_by_model() == {A100: 24}  # the node that is down does not count
    w = inputs.workload
    assert sorted(w.job_ids) == ["queued-1", "running-1"]
    row = w.job_ids.index("running-1")
    assert w.running[row].elapsed_s == pytest.approx(1800.0) and w.running[row].tokens_per_second == 5000.0
    assert w.running[row].power_w == 287.5  # what its progress reported, for the rest of its run
    assert w.arrival_s[w.job_ids.index("queued-1")] == pytest.approx(-1200.0)
    assert any("1 queued or running job(s) left out" in n for n in inputs.notes)
    # 52 submissions in the two days of lookback (one an hour, four more in the last hours); the mix is the
    # 51 with a configuration.
    assert inputs.arrivals is not None and inputs.arrivals.daily_jobs == pytest.approx(26.0)
    assert len(inputs.arrivals.mix) == 51
    assert sorted(inputs.failure_times_s.tolist()) == [120.0 + h for h in range(0, 48, 5)]

    doc = forecast(inputs, FallbackModels(), ForecastOptions(horizon_s=4 * 3600.0, runs=3, workers=1))
    assert doc["start"] == NOW.isoformat()
    assert doc["summary"]["jobs"]["mean"] >= 2
    assert doc["summary"]["utilization_by_type"][A100]["mean"] > 0


def test_the_forecast_asks_the_models_with_each_jobs_protocol_as_the_store_holds_it(engine: Engine) -> None:
    """The store keeps what telemetry said of a job's protocol (experiment id, identifier, tuning version,
    dtype), which the models' protocol features read; the twin built its jobs without it, so the models
    predicted every live job as of no known protocol. On the bundled replay its failure share of the
    arrivals read 0.286-0.310 where the runs failed at 0.32; with the protocol, 0.297-0.318."""
    protocol = {"experiment_id": "SFTTrainer.finetune-full-fsdp-v1.6.0", "fms_hf_tuning_version": "2.4.0",
                "identifier": "model_name.llama3-8b-number_gpus.2.0", "torch_dtype": "bfloat16"}  # fmt: skip
    populate(engine)
    with session_scope(engine) as session:
        session.add(job("queued-with-protocol", "submitted", NOW - timedelta(minutes=5), **protocol))
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=2))
    queued = inputs.workload.job_ids.index("queued-with-protocol")
    assert inputs.workload.catalog[inputs.workload.config_idx[queued]].extra == protocol
    assert inputs.arrivals is not None and protocol in [c.extra for c in inputs.arrivals.mix.catalog]
    # The same configuration without a protocol stays a configuration of its own.
    assert {} in [c.extra for c in inputs.arrivals.mix.catalog]


def test_before_a_calibration_jobs_fail_in_the_forecast_as_the_clusters_runs_failed(engine: Engine) -> None:
    """The uncalibrated fallback has no failure model: it forecast that no job fails, where a fifth of
    this cluster's runs had failed (`finetwin up`'s first forecast: 0 failures an hour against 17)."""
    populate(engine)
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=2))
    # One configuration: 49 runs ended in the window, 10 of them failed at runtime.
    assert inputs.outcomes is not None and (inputs.outcomes.ran, inputs.outcomes.failed) == (39, 10)
    options = ForecastOptions(horizon_s=24 * 3600.0, runs=8, workers=1)
    doc = forecast(inputs, FallbackModels(), options, model_source=FALLBACK_LABEL)
    assert 0.1 < doc["summary"]["runtime_failure_ratio"]["mean"] < 0.35  # p_valid (39 + 2 x 40/51) / 51
    assert inputs.outcomes.note() in doc["notes"] and "10 of 49 ended runs" in inputs.outcomes.note()
    # A what-if's scenario keeps them, and a calibrated model is left as it is.
    scenario, _ = apply_changes(inputs, options, ScenarioChanges(policy=Policy.BACKFILL))
    assert scenario.outcomes is inputs.outcomes
    assert models_for(inputs, FallbackModels()).outcomes is inputs.outcomes  # type: ignore[union-attr]
    # So does a capacity plan's sweep, which asks the models itself.
    sweep = prepare_inputs(
        inputs, FallbackModels(), SweepRequest(vary=[f"{A100}=1..2"], runs=1), DEFAULT_SLOS
    )
    assert 0.7 < sweep.catalogs["off"].p_valid.max() < 0.9
    calibrated = cast(JobModels, object())
    assert models_for(inputs, calibrated) is calibrated


def test_the_order_a_store_keeps_its_jobs_in_does_not_change_the_forecast(tmp_path: Path) -> None:
    """The same jobs written in two orders: the arrivals' mix (and so every seeded forecast) was built in
    the order the database returned them, which differs between stores and query plans (and, for jobs
    submitted in the same second, with the order they were written in)."""
    from finetwin.schema import migrate
    from twin.db import make_engine

    models = ("llama3-8b", "granite-3-8b", "mistral-7b-v0.1", "llama3.1-70b")

    def history() -> list[Job]:
        # Two jobs an hour, submitted in the same second: the index keeps those two in the order written.
        return [job(f"old-{h}-{k}", "completed", NOW - timedelta(hours=30 - h),
                    model_name=models[(h + k) % 4], ended_at=NOW - timedelta(hours=29 - h))
                for h in range(24) for k in range(2)]  # fmt: skip

    documents = []
    for name, jobs in (("forward", history()), ("backward", history()[::-1])):
        engine = make_engine(f"sqlite:///{tmp_path / name}.db")
        migrate(engine)
        with session_scope(engine) as session:
            session.add(Node(node_id="n0", gpu_model=A100, gpu_count=8, status="up", updated_at=NOW))
            session.add_all(jobs)
        inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=2))
        assert inputs.arrivals is not None
        options = ForecastOptions(horizon_s=12 * 3600.0, runs=2, workers=1, seed=5)
        doc = forecast(inputs, FallbackModels(), options)
        documents.append({k: v for k, v in doc.items() if k not in ("generated_at", "wall_s")})
        engine.dispose()
    assert documents[0] == documents[1]


def test_a_job_without_its_work_takes_the_work_the_window_observed(engine: Engine) -> None:
    """A queued job that does not say its work takes the median of what the window's ended jobs did, read
    from their observed runs (only those: every observed run of the record was read for each forecast)."""
    with session_scope(engine) as session:
        session.add(Node(node_id="n0", gpu_model=A100, gpu_count=8, status="up", updated_at=NOW))
        for k, work in enumerate((1e5, 2e5, 3e5)):
            ended = NOW - timedelta(hours=k + 1)
            session.add(job(f"done-{k}", "completed", ended - timedelta(hours=1), dataset_tokens=None))
            session.flush()
            session.add(ObservedRun(job_id=f"done-{k}", is_valid=1, observed_at=ended, train_runtime=100.0,
                                    dataset_tokens_per_second=work / 100.0))  # fmt: skip
        session.add(job("queued", "submitted", NOW - timedelta(minutes=5), dataset_tokens=None))
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=1))
    assert any("assumed 200,000 tokens" in note for note in inputs.notes), inputs.notes


def test_nodes_and_jobs_that_spell_their_gpu_differently_share_its_pool(engine: Engine) -> None:
    """Nodes reported by a DCGM-fed agent (`NVIDIA A100-SXM4-80GB`) and jobs by people (`A100-SXM`): the
    nodes were a GPU type of their own, no job was ever placed on them, and the queue grew in every run."""
    with session_scope(engine) as session:
        session.add(
            Node(node_id="n0", gpu_model="NVIDIA A100-SXM4-80GB", gpu_count=8, status="up", updated_at=NOW)
        )
        session.add(job("queued-1", "submitted", NOW - timedelta(minutes=20), gpu_model="A100-SXM"))
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=1))
    assert inputs.cluster.gpus_by_model() == {A100: 8}
    doc = forecast(inputs, FallbackModels(), ForecastOptions(horizon_s=4 * 3600.0, runs=2, workers=1))
    assert doc["summary"]["utilization_by_type"][A100]["mean"] > 0


def test_forecasts_are_stored_and_the_latest_comes_back(engine: Engine) -> None:
    assert latest_forecast(engine, cluster_id="default") is None
    ids = [
        save_forecast(engine, {"runs": 4, "seed": 1, "n": k}, cluster_id="default", keep=2) for k in range(3)
    ]
    latest = latest_forecast(engine, cluster_id="default", kind=STANDING)
    assert latest is not None and latest.id == ids[-1] and latest.document["n"] == 2
    assert latest_forecast(engine, cluster_id="other") is None


@pytest.fixture
def parts(engine: Engine, tmp_path: Path) -> Any:
    settings = Settings(
        data_dir=tmp_path / "data", models_dir=tmp_path / "models", scheduler_enabled=False, forecast_runs=3
    )
    return api_parts(settings, engine)


@pytest.fixture
def api(engine: Engine, parts: Any) -> Iterator[tuple[TestClient, dict[str, str]]]:
    from advisor.app import create_app

    with TestClient(create_app(parts)) as client:
        yield client, api_headers(engine, "viewer")


def test_forecast_endpoint_computes_stores_and_serves(
    api: tuple[TestClient, dict[str, str]], parts: Any, engine: Engine
) -> None:
    client, headers = api
    assert client.get("/v1/forecast").status_code == 401
    empty = client.get("/v1/forecast", headers=headers)
    assert empty.status_code == 409 and "no node" in empty.json()["detail"]
    populate(engine, datetime.now(UTC))
    # The scheduler's job (registered at startup) refreshes and stores the standing forecast.
    job = parts.scheduler.get_job("standing-forecast")
    job.func(*job.args)
    stored = latest_forecast(engine, cluster_id="default")
    assert stored is not None and stored.document["runs"] == 3
    served = client.get("/v1/forecast", headers=headers)
    assert served.status_code == 200 and served.json()["id"] == stored.id
    assert set(served.json()["summary"]["wait_p95_s"]) == {"mean", "p10", "p90"}
    # Refreshing is an operator's POST, at most one per FINETWIN_FORECAST_REFRESH_MIN_SECONDS.
    assert client.post("/v1/forecast/refresh", headers=headers).status_code == 403
    operator = api_headers(engine, "operator")
    fresh = client.post("/v1/forecast/refresh", headers=operator)
    assert fresh.status_code == 200 and fresh.json()["id"] > stored.id
    again = client.post("/v1/forecast/refresh", headers=operator)
    assert again.status_code == 429 and int(again.headers["Retry-After"]) > 0
    assert latest_forecast(engine, cluster_id="default").id == fresh.json()["id"]  # type: ignore[union-attr]


def test_a_forecast_get_never_writes(api: tuple[TestClient, dict[str, str]], engine: Engine) -> None:
    """GET /v1/forecast?refresh=true wrote a row per request; a GET now only reads, and refuses the parameter
    (POST /v1/forecast/refresh refreshes)."""
    client, headers = api
    populate(engine, datetime.now(UTC))
    for _ in range(2):
        response = client.get("/v1/forecast", headers=headers)
        assert response.status_code == 200 and "id" not in response.json()
        assert set(response.json()["summary"]["wait_p95_s"]) == {"mean", "p10", "p90"}
    refused = client.get("/v1/forecast", params={"refresh": "true"}, headers=headers)
    assert refused.status_code == 422 and "query.refresh: unknown parameter" in refused.json()["detail"]
    assert latest_forecast(engine, cluster_id="default") is None


def test_whatif_endpoint_validates_and_pairs(api: tuple[TestClient, dict[str, str]], engine: Engine) -> None:
    client, headers = api
    populate(engine, datetime.now(UTC))
    for bad in (
        {"runs": 0},
        {"runs": 1000},
        {"horizon": "whenever"},
        {"changes": {"nodes": [{"gpu_model": A100, "add": -1}]}},
        {"changes": {"admission": "maybe"}},
        {"surprise": 1},
    ):
        response = client.post("/v1/whatif", json=bad, headers=headers)
        assert response.status_code == 422, bad
        assert response.json()["detail"]
    too_many = client.post(
        "/v1/whatif",
        json={"runs": 2, "changes": {"nodes": [{"gpu_model": A100, "remove": 9}]}},
        headers=headers,
    )
    assert too_many.status_code == 422 and "cannot remove 9" in too_many.json()["detail"]
    empty = client.post("/v1/whatif", json={"horizon": "4h", "runs": 3}, headers=headers)
    assert empty.status_code == 200
    assert all(d["mean"] == 0.0 for name, d in empty.json()["difference"].items() if name != "slos")
    more = client.post(
        "/v1/whatif",
        json={"horizon": "4h", "runs": 3, "changes": {"nodes": [{"gpu_model": "A100-SXM", "add": 1}]}},
        headers=headers,
    )
    assert more.status_code == 200
    assert more.json()["scenario"]["cluster"]["gpus_by_model"][A100] == 32


def test_forecast_command_reads_the_store(
    engine: Engine,
    database_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATABASE_URL", database_url)
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "no-models"))
    assert main(["forecast", "--horizon", "2h", "--runs", "2"]) == 2
    assert "no node" in capsys.readouterr().err
    populate(engine, datetime.now(UTC))
    assert main(["forecast", "--horizon", "2h", "--interval", "30m", "--runs", "2", "--json", "--store"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["horizon_s"] == 7200 and len(doc["series"]["t_s"]) == 4 and doc["models"] == "fallback"
    assert doc["known_jobs"] == {"total": 2, "running": 1, "queued": 1}
    assert latest_forecast(engine, cluster_id="default", kind="on_demand") is not None


def test_sqlite_reads_the_newest_failure_times_back_along_the_end_time_index(tmp_path: Path) -> None:
    """Through the state index, SQLite read and sorted every failed job of the record for each forecast."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    populate(engine)
    plans = sqlite_plans(engine, lambda: load_live_inputs(engine, now=NOW))
    (failures_plan,) = [plan for sql, plan in plans.items() if sql.startswith("SELECT jobs.failed_after_s")]
    assert "ix_jobs_ended_at" in failures_plan and "ix_jobs_state" not in failures_plan
    engine.dispose()
