"""Cluster steering: candidate actions evaluated by paired what-ifs against the SLOs, the helpful ones
recorded as pending recommendations ranked by effect per cost."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor.records import SloDocument
from advisor.steering import candidates
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers, api_parts
from twin.db import make_engine, session_scope
from twin.forecast import ForecastOptions
from twin.live_state import load_live_inputs
from twin.store import utcnow

WAIT_SLO = {"slos": [{"name": "p95 wait <= 30 min", "metric": "wait_p95_s", "max": 1800}]}


@pytest.fixture
def store(sqlite_url: str) -> Engine:
    engine = make_engine(sqlite_url)
    migrate(engine)
    seed_overloaded_cluster(engine)
    return engine


@pytest.fixture
def app_client(store: Engine, tmp_path: Path, in_use: FakeInUse):  # type: ignore[no-untyped-def]
    settings = advisor_settings(tmp_path, steering_replications=4, steering_horizon_hours=12)
    in_use.models = FakeModels()
    with TestClient(api_app(settings, store, in_use)) as client:
        yield client


def test_candidates_cover_the_action_kinds(store: Engine) -> None:
    inputs = load_live_inputs(store)
    kinds = {c.kind for c in candidates(inputs, ForecastOptions())}
    assert {"add_nodes", "admission_repair", "policy", "optimization_default", "cap_batch"} <= kinds
    assert "remove_nodes" not in kinds  # only one node of the type: nothing to remove


def test_steering_recommends_what_helps_the_slos(app_client: TestClient, store: Engine) -> None:
    operator = api_headers(store, "operator")
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
    viewer = api_headers(store, "viewer")
    assert app_client.post("/v1/recommendations/run", headers=viewer).status_code == 403
    before = app_client.get("/v1/recommendations/steering", headers=viewer).json()
    assert before["ran"] is False and "has not run yet" in before["why_none"]

    response = app_client.post("/v1/recommendations/run", headers=operator)
    assert response.status_code == 200, response.text
    run = response.json()
    assert run["evaluated"] >= 5
    recs = run["recommendations"]
    kinds = {r["kind"]: r for r in recs}
    assert "add_nodes" in kinds, [r["title"] for r in recs]
    add = kinds["add_nodes"]
    assert add["state"] == "pending" and add["target"] == "nodes:NVIDIA-A100-SXM4-80GB"
    assert add["effect"]["mean"] > 0 and add["effect"]["ci95"][0] > 0 and add["effect"]["runs"] == 4
    assert add["cost"] == pytest.approx(8 * 24)
    for rec in recs:  # only what improves SLO attainment is recorded, saying which SLO and by how much
        assert rec["effect"]["ci95"][0] > 0
        assert rec["effect"]["helps"]["slo"] == WAIT_SLO["slos"][0]["name"]
        assert rec["effect"]["helps"]["attainment_change"] > 0
    last = app_client.get("/v1/recommendations/steering", headers=viewer).json()
    assert last["ran"] and last["recommended"] == len(recs) and last["why_none"] is None
    assert [r["score"] for r in recs] == sorted((r["score"] for r in recs), reverse=True)

    again = app_client.post("/v1/recommendations/run", headers=operator).json()
    listing = app_client.get("/v1/recommendations", params={"state": "superseded"}, headers=viewer).json()
    assert {r["id"] for r in listing["recommendations"]} == {r["id"] for r in recs}
    assert len(again["recommendations"]) == len(recs)  # paired seeds: the same state gives the same answer


def test_steering_without_models_says_why(app_client: TestClient, store: Engine, in_use: FakeInUse) -> None:
    in_use.models = None
    response = app_client.post("/v1/recommendations/run", headers=api_headers(store, "operator"))
    assert response.status_code == 409 and "calibrate" in response.json()["detail"]


def test_slos_are_validated_and_audited(app_client: TestClient, store: Engine) -> None:
    operator = api_headers(store, "operator")
    assert app_client.get("/v1/slos", headers=operator).json()["source"] == "default"
    bad = app_client.put("/v1/slos", json={"slos": [{"name": "x", "metric": "wait_p95_s"}]}, headers=operator)
    assert bad.status_code == 422 and "max or min" in bad.json()["detail"]
    # A percentage written as one: a floor no cluster reaches, a ceiling no forecast breaks.
    for metric, bound, said in (
        ("utilization", {"min": 70.0}, "utilization is a share from 0 to 1: write 0.7 for 70 %"),
        (
            "runtime_failure_ratio",
            {"max": 10.0},
            "runtime_failure_ratio is a share from 0 to 1: write 0.1 for",
        ),
    ):
        share = {"slos": [{"name": "x", "metric": metric, **bound}]}
        bad = app_client.put("/v1/slos", json=share, headers=operator)
        assert bad.status_code == 422 and said in bad.json()["detail"], bad.text
    one = {"slos": [{"name": "x", "metric": "utilization", "min": 1.0}]}  # all of it: strict, but a share
    assert app_client.put("/v1/slos", json=one, headers=operator).status_code == 200
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=api_headers(store, "viewer")).status_code == 403
    put = app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).json()
    assert put["source"] == "api" and put["slos"][0]["max"] == 1800
    audit = app_client.get("/v1/audit", params={"subject": "slos"}, headers=operator).json()
    assert audit["entries"][0]["to_state"] == "declared"


def test_slos_need_names_of_their_own_and_gpu_types_that_exist(app_client: TestClient, store: Engine) -> None:
    """Both were accepted: of two SLOs named alike one vanished from every attainment series (keyed by name),
    and an SLO on a misspelled GPU type was never met."""
    operator = api_headers(store, "operator")
    twice = {"slos": [{"name": "a", "metric": "wait_p95_s", "max": 60.0}] * 2}
    bad = app_client.put("/v1/slos", json=twice, headers=operator)
    assert bad.status_code == 422 and "two SLOs are named 'a'" in bad.json()["detail"], bad.text
    typo = {"slos": [{"name": "u", "metric": "utilization", "min": 0.5, "gpu_model": "Tesla V100"}]}
    bad = app_client.put("/v1/slos", json=typo, headers=operator)
    assert bad.status_code == 422 and "unknown GPU model 'Tesla V100'" in bad.json()["detail"], bad.text
    spelled = {"slos": [{"name": "u", "metric": "utilization", "min": 0.5, "gpu_model": "A100-SXM"}]}
    put = app_client.put("/v1/slos", json=spelled, headers=operator)
    assert put.status_code == 200 and put.json()["slos"][0]["gpu_model"] == "NVIDIA-A100-SXM4-80GB"
    # A set stored before these checks is read as it was stored: the API still serves it.
    with session_scope(store) as session:
        document = {"slos": twice["slos"] + typo["slos"]}
        session.add(SloDocument(created_at=utcnow(), created_by="then", document=document))
    got = app_client.get("/v1/slos", headers=operator)
    assert got.status_code == 200 and [s["name"] for s in got.json()["slos"]] == ["a", "a", "u"]


def test_the_slo_file_is_read_and_a_bad_one_stops_the_api(store: Engine, tmp_path: Path) -> None:
    good = tmp_path / "slos.yaml"
    good.write_text("slos:\n  - {name: util, metric: utilization, min: 0.5}\n")
    from advisor.app import create_app

    parts = api_parts(advisor_settings(tmp_path, slo_file=good), store)
    with TestClient(create_app(parts)) as client:
        got = client.get("/v1/slos", headers=api_headers(store, "viewer")).json()
        assert got["source"] == "file" and got["slos"][0]["metric"] == "utilization"
        assert parts.scheduler.get_job("recommendations-steering") is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text("slos:\n  - {name: util, metric: joy, min: 0.5}\n")
    app = api_app(advisor_settings(tmp_path, slo_file=bad), store)
    with pytest.raises(Exception, match="bad.yaml"), TestClient(app):
        pass


def test_why_nothing_and_the_helped_slo_are_said_plainly() -> None:
    from advisor.steering import Candidate, helped_slo, why_nothing

    assert why_nothing([]) == "no candidate action applies to this cluster and workload"
    candidate = Candidate(kind="add_nodes", target="nodes:A", title="add 1 A node", action={}, changes={},
                          cost=10.0)  # fmt: skip
    effect = {"mean": 0.004, "ci95": [-0.002, 0.01]}
    text = why_nothing([(candidate, {"effect": effect})])
    assert "1 candidates evaluated" in text and "add 1 A node" in text
    assert "+0.4 points (-0.2 to +1.0)" in text
    per_slo = [
        {"name": "wait", "attainment": {"mean": 0.2, "ci95": [0.1, 0.3]}, "probability_met": 0.5},
        {"name": "util", "attainment": {"mean": -0.05, "ci95": [-0.1, 0.0]}, "probability_met": -0.1},
    ]
    assert helped_slo(per_slo) == {
        "slo": "wait", "attainment_change": 0.2, "ci95": [0.1, 0.3], "probability_met_change": 0.5
    }  # fmt: skip
    assert helped_slo(per_slo[1:]) is None  # it helps none of them
