"""The models API: `POST /v1/predict`, `GET /v1/models`, `GET /v1/models/live-error`; 4xx on bad input,
never 5xx. Requests carry an API key (a viewer's: predictions only compute)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from calibrate.features import DATA_SHEET_GPU_NOTE
from calibrate.live_error import prediction_hook
from finetwin.schema import migrate
from finetwin.settings import Settings
from ingest.apply import apply_events
from ingest.events import JobCompleted, JobSubmitted, new_event
from tests.conftest import api_app, api_headers, api_parts, wait_for
from twin.db import make_engine

CONFIG = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 2,
    "number_nodes": 1, "batch_size": 8, "tokens_per_sample": 1024,
}  # fmt: skip
T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_url)
    migrate(engine)
    yield engine
    engine.dispose()


def client_for(engine: Engine, models_dir: Path, tmp_path: Path, role: str = "viewer") -> TestClient:
    settings = Settings(data_dir=tmp_path / "data", models_dir=models_dir, scheduler_enabled=False)
    app = api_app(settings, engine)
    return TestClient(app, headers=api_headers(engine, role, name=f"{role}-tester"))


@pytest.fixture
def client(store: Engine, registry_copy: Path, tmp_path: Path) -> Iterator[TestClient]:
    with client_for(store, registry_copy, tmp_path) as test_client:
        yield test_client


def test_predict_one_config_a_list_or_a_batch(client: TestClient) -> None:
    one = client.post("/v1/predict", json=CONFIG)
    assert one.status_code == 200, one.text
    body = one.json()
    assert body["model_version"] == "v0001"
    (prediction,) = body["predictions"]
    assert prediction["outcome"] == "valid" and prediction["rule"] is None
    assert 0.5 <= prediction["p_valid"] <= 1
    assert 0 < prediction["tokens_per_second_p10"] <= prediction["tokens_per_second_p50"]
    assert prediction["tokens_per_second_p50"] <= prediction["tokens_per_second_p90"]

    batch = [CONFIG, {**CONFIG, "batch_size": 7}, {**CONFIG, "number_gpus": 8, "batch_size": 32}]
    for request in (batch, {"configs": batch}):
        response = client.post("/v1/predict", json=request)
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        assert [p["outcome"] for p in predictions][:2] == ["valid", "rejected"]
        assert predictions[1]["rule"] == "batch_size_not_multiple_of_gpus"
        assert predictions[1]["p_valid"] == 0.0
        assert predictions[0] == prediction, "the same config gets the same answer"
    response = client.post("/v1/predict", json={**CONFIG, "model_name": "acme-13b-chat"})
    (unseen,) = response.json()["predictions"]
    assert unseen["note"] and unseen["tokens_per_second_p50"] > 0


def test_predict_and_advise_take_a_method_and_names_as_people_write_them(client: TestClient) -> None:
    """`LoRA` (as people write it) was a 422 from the API and `finetwin advise`, where a configurations CSV
    took it; a GPU as nvidia-smi prints it and a model as Hugging Face names it were unknown."""
    written = {**CONFIG, "method": " LoRA", "gpu_model": "NVIDIA A100-SXM4-80GB",
               "model_name": "meta-llama/Meta-Llama-3-8B"}  # fmt: skip
    response = client.post("/v1/predict", json=[CONFIG, written])
    assert response.status_code == 200, response.text
    first, second = response.json()["predictions"]
    assert second == first and first["note"] is None
    advice = [client.post("/v1/advise", json=body) for body in (CONFIG, written)]
    assert [a.status_code for a in advice] == [200, 200], advice[1].text
    answers = [a.json() for a in advice]
    assert answers[1]["notes"] == answers[0]["notes"]
    for part in ("verdict", "placement", "optimizations"):  # p_valid_low too: a pair the version saw
        assert answers[1][part] == answers[0][part], part
    assert client.post("/v1/predict", json={**CONFIG, "method": "LoRAA"}).status_code == 422


def test_a_gpu_the_benchmark_never_ran_is_predicted_from_its_data_sheet(client: TestClient) -> None:
    """An A100 of 40 GB and an L4 (24 GB) were unknown GPUs, taken as an A100-PCIe of 80 GB: a full
    fine-tuning of an 8B model on two of them ran as surely as on two of 80 GB. A name the catalogue lacks
    is now refused, as `finetwin predict` and `/v1/advise` refuse it."""
    heavy = {**CONFIG, "method": "full", "batch_size": 8, "tokens_per_sample": 2048}
    gpus = (
        "NVIDIA-A100-80GB-PCIe",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA L4",
        "NVIDIA-H100-PCIe",
        "NVIDIA H100 80GB HBM3",
    )
    response = client.post("/v1/predict", json=[{**heavy, "gpu_model": gpu} for gpu in gpus])
    assert response.status_code == 200, response.text
    a100_80, a100_40, l4, h100_pcie, h100_sxm = response.json()["predictions"]
    assert a100_40["p_valid"] < a100_80["p_valid"] - 0.3 and l4["p_valid"] <= a100_40["p_valid"]
    assert l4["tokens_per_second_p50"] < a100_40["tokens_per_second_p50"]
    assert h100_sxm["tokens_per_second_p50"] > 1.3 * h100_pcie["tokens_per_second_p50"]
    assert a100_80["note"] is None and h100_pcie["note"] is None
    assert a100_40["note"] == l4["note"] == h100_sxm["note"] == DATA_SHEET_GPU_NOTE
    ambiguous = client.post("/v1/predict", json={**CONFIG, "gpu_model": "A100"})
    assert ambiguous.status_code == 422, ambiguous.text
    assert "unknown GPU model 'A100'; did you mean 'NVIDIA-A100-SXM4-80GB'" in ambiguous.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in CONFIG.items() if k != "gpu_model"}, "gpu_model"),
        ({**CONFIG, "number_gpus": 0}, "number_gpus"),
        ({**CONFIG, "batch_size": "many"}, "batch_size"),
        ({**CONFIG, "method": "qlora"}, "method"),
        ({**CONFIG, "time_limit_s": -5}, "time_limit_s"),
        ({**CONFIG, "colour": "blue"}, "colour"),
        ({"configs": []}, "configs"),
        ([CONFIG, {**CONFIG, "fast_moe": -1}], "configs.1.fast_moe"),
        ("not an object", "body"),
    ],
)
def test_a_bad_body_is_a_422_naming_the_field(client: TestClient, body: Any, field: str) -> None:
    response = client.post("/v1/predict", json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]


def test_a_body_that_is_not_json_is_a_422(client: TestClient) -> None:
    response = client.post("/v1/predict", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 422


def test_without_a_model_in_use_predict_is_a_409_that_says_what_to_do(store: Engine, tmp_path: Path) -> None:
    with client_for(store, tmp_path / "no-models", tmp_path) as client:
        response = client.post("/v1/predict", json=CONFIG)
        assert response.status_code == 409
        assert "finetwin calibrate" in response.json()["detail"]
        models = client.get("/v1/models")
        assert models.status_code == 200 and models.json() == {
            "in_use": None, "trees": None, "versions": [], "history": [],
        }  # fmt: skip
        live = client.get("/v1/models/live-error")
        assert live.status_code == 200 and live.json()["points"] == [] and live.json()["current"] is None


def test_a_tampered_model_in_use_is_a_409_not_a_500(
    store: Engine, registry_copy: Path, tmp_path: Path
) -> None:
    artifact = sorted((registry_copy / "versions" / "v0001" / "estimators").glob("*.skops"))[0]
    artifact.write_bytes(artifact.read_bytes() + b"!")
    with client_for(store, registry_copy, tmp_path) as client:
        response = client.post("/v1/predict", json=CONFIG)
    assert response.status_code == 409
    assert "tampered or corrupted" in response.json()["detail"]


def test_models_lists_the_versions_with_their_metrics(client: TestClient) -> None:
    response = client.get("/v1/models")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["in_use"] == "v0001"
    (version,) = body["versions"]
    assert version["version"] == "v0001" and version["in_use"] is True
    assert version["rows"] == 3983 and version["rows_by_source"] == {"benchmark:llmftbench_sample.csv": 3983}
    assert 0 < version["heldout_metrics"]["throughput_mdape"] < 1
    assert [h["action"] for h in body["history"]] == ["promote"]


def test_models_says_how_the_trees_run_and_they_turn_native_in_the_background(client: TestClient) -> None:
    """Nothing loaded: null; the first prediction loads the version and starts compiling its trees
    (calibrate/native_trees.py) while it answers through the tree walker; then they run as machine code."""
    assert client.get("/v1/models").json()["trees"] is None
    assert client.post("/v1/predict", json=CONFIG).status_code == 200
    assert client.get("/v1/models").json()["trees"] in ("compiling", "native")
    wait_for(lambda: client.get("/v1/models").json()["trees"] == "native", 180, "the trees compiled")
    assert client.post("/v1/predict", json=CONFIG).status_code == 200


def test_live_error_is_rolled_over_the_last_finished_jobs(
    client: TestClient, store: Engine, registry_copy: Path
) -> None:
    hook = prediction_hook(Settings(), models_dir=registry_copy)
    jobs = [f"job-{i}" for i in range(4)]
    apply_events(
        store, [new_event("job.submitted", JobSubmitted(**CONFIG), job_id=j, ts=T0) for j in jobs], [hook]
    )
    p50 = client.post("/v1/predict", json=CONFIG).json()["predictions"][0]["tokens_per_second_p50"]
    for i, (job, factor) in enumerate(zip(jobs, (1.0, 0.5, 0.5, 0.5), strict=True)):
        payload = JobCompleted(train_runtime=60.0, dataset_tokens_per_second=p50 * factor)
        apply_events(
            store, [new_event("job.completed", payload, job_id=job, ts=T0 + timedelta(minutes=i))], [hook]
        )

    response = client.get("/v1/models/live-error", params={"window": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["window"] == 2 and body["in_use"] == "v0001"
    points = body["points"]
    assert [p["job_id"] for p in points] == jobs
    assert [p["ape"] for p in points] == pytest.approx([0.0, 1.0, 1.0, 1.0])
    assert [p["rolling_mdape"] for p in points] == pytest.approx([0.0, 0.5, 1.0, 1.0])
    assert [p["rolling_jobs"] for p in points] == [1, 2, 2, 2]
    current = body["current"]
    assert current["jobs"] == 2 and current["mdape"] == pytest.approx(1.0)
    assert current["drifting"] is False, "2 jobs are fewer than drift_min_jobs"
    limited = client.get("/v1/models/live-error", params={"window": 2, "limit": 1}).json()["points"]
    assert len(limited) == 1 and limited[0]["rolling_mdape"] == pytest.approx(1.0)
    assert client.get("/v1/models/live-error", params={"window": 0}).status_code == 422
    mine = client.get("/v1/models/live-error", params={"model_version": "v0001"}).json()["points"]
    assert [p["job_id"] for p in mine] == jobs
    # A version that is nowhere (`v1` for `v0001`) read as one without finished jobs: an empty series.
    for missing in ("v1", "v0002"):
        response = client.get("/v1/models/live-error", params={"model_version": missing})
        assert response.status_code == 404, response.text
        assert response.json()["detail"] == f"no model version '{missing}' (versions: v0001)"


def test_startup_puts_the_hourly_refit_and_the_drift_check_on_the_scheduler(
    store: Engine, registry_copy: Path, tmp_path: Path
) -> None:
    from advisor.app import create_app

    settings = Settings(data_dir=tmp_path / "data", models_dir=registry_copy, scheduler_enabled=False)
    parts = api_parts(settings, store)
    with TestClient(create_app(parts)):
        scheduler = parts.scheduler
        refit = scheduler.get_job("calibrate.refit")
        assert refit is not None and refit.trigger.interval == timedelta(hours=1)
        check = scheduler.get_job("calibrate.drift-check")
        assert check is not None and check.trigger.interval == timedelta(seconds=60)


@pytest.mark.parametrize("registry", ["in use", "empty"])
def test_an_api_with_refits_off_fits_nothing_and_uses_what_the_registry_has(
    store: Engine, registry_copy: Path, tmp_path: Path, registry: str
) -> None:
    """`FINETWIN_REFITS=false`, for all but one of several APIs on one registry: no hourly refit, no drift
    check, and no first model of an empty registry (the refitting API fits it); predictions use the version
    in use as ever."""
    from advisor.app import create_app

    models = registry_copy if registry == "in use" else tmp_path / "empty"
    settings = Settings(data_dir=tmp_path / "data", models_dir=models, scheduler_enabled=False, refits=False)
    parts = api_parts(settings, store)
    with TestClient(create_app(parts)) as client:
        jobs = [job.id for job in parts.scheduler.get_jobs()]
        assert parts.refits is None and not [job for job in jobs if job.startswith("calibrate.")], jobs
        assert "standing-forecast" in jobs, "the API's other periodic work is still scheduled"
        answer = client.post("/v1/predict", json=CONFIG, headers=api_headers(store))
        assert answer.status_code == (200 if registry == "in use" else 409), answer.text
