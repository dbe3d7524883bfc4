"""Job advice with the real calibrated models (fitted once per session on the bundled benchmark sample):
over HTTP and from the command line, every candidate predicted in one model call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from advisor.advice import advise_job, advise_many
from advisor.advice_answer import RECOMMEND_P_VALID_LOW
from advisor.advice_schemas import AdviceRequest
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.conftest import api_app, api_headers, api_parts
from twin.db import make_engine

pytestmark = pytest.mark.slow
JOB = {
    "model_name": "llama3.1-8b", "method": "lora", "gpu_model": "A100-SXM", "number_gpus": 4,
    "batch_size": 16, "tokens_per_sample": 2048, "dataset_tokens": 1e9,
}  # fmt: skip


@pytest.fixture
def client(sqlite_url: str, calibrated_models_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    engine = make_engine(sqlite_url)
    migrate(engine)
    app = api_app(advisor_settings(tmp_path, models_dir=calibrated_models_dir), engine)
    with TestClient(app, headers=api_headers(engine, "viewer")) as test_client:
        yield test_client


def test_advice_with_the_calibrated_models(client: TestClient) -> None:
    response = client.post("/v1/advise", json=JOB)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model_version"] and answer["verdict"]["status"] in ("valid", "likely_oom")
    assert 0.0 <= answer["verdict"]["p_valid"] <= 1.0
    for name in ("fewest_gpus", "best_throughput", "best_cost"):
        option = answer[name]
        if option is None:
            continue
        prediction = option["prediction"]
        assert prediction["p_valid"] >= 0.7, name
        band, run = prediction["tokens_per_second"], prediction["run_time_s"]
        assert 0 < band["p10"] <= band["p50"] <= band["p90"]
        assert run["p10"] <= run["p50"] <= run["p90"]
        assert run["p50"] == pytest.approx(1e9 / band["p50"])
        assert option["gpus_per_worker"] <= 8 and option["evidence"], name
        assert prediction["energy_kwh"] > 0 and prediction["gpu_hours"] > 0
    assert answer["best_throughput"] is not None and answer["best_cost"] is not None
    kinds = {o["name"]: o for o in answer["optimizations"]}
    assert kinds["fast_kernels"]["recommended"] and kinds["fast_kernels"]["evidence"][0]["paper"]


def _count_predict_frame(models: object, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows of each predict_columns call (the array form of predict_frame, which advice uses); the
    per-quantity methods raise (everything goes through the one vectorized call, power included)."""
    from calibrate.config_frame import row_count

    calls: list[int] = []
    original = type(models).predict_columns  # type: ignore[attr-defined]

    def counting(self, table, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(row_count(table))
        return original(self, table, *args, **kwargs)

    monkeypatch.setattr(type(models), "predict_columns", counting)
    for name in ("predict_throughput", "predict_failure", "predict_power_watts"):
        monkeypatch.setattr(type(models), name, _forbidden(name))
    return calls


def test_one_model_call_per_answer(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    _version, models = client.app.state.runtime.models_in_use.get()  # type: ignore[attr-defined]
    calls = _count_predict_frame(models, monkeypatch)
    response = client.post("/v1/advise", json={**JOB, "batch_size": 6})
    assert response.status_code == 200, response.text
    assert len(calls) == 1 and calls[0] > 50, calls  # every candidate in one call
    assert response.json()["repair"]["config"]["batch_size"] == 8
    assert response.json()["repair"]["prediction"]["energy_kwh"] > 0


def test_several_answers_share_one_model_call(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """advise_many answers each configuration exactly as advise_job does alone, with one call for all."""
    version, models = client.app.state.runtime.models_in_use.get()  # type: ignore[attr-defined]
    bodies = [
        JOB,
        {**JOB, "batch_size": 6},
        {**JOB, "model_name": "mixtral-8x7b-instruct-v0.1", "number_gpus": 16},
    ]
    jobs = [AdviceRequest.model_validate(body).to_job() for body in bodies]
    alone = [advise_job(config, work, models, model_version=version) for config, work in jobs]
    calls = _count_predict_frame(models, monkeypatch)
    together = advise_many(jobs, models, model_version=version)
    assert len(calls) == 1 and calls[0] > 3 * 50, calls
    # Equal but for the last bits of a float (the compiled trees sum in another order for another batch).
    assert _rounded([a.model_dump() for a in together]) == _rounded([a.model_dump() for a in alone])  # type: ignore[union-attr]
    assert len({a.config.model_name for a in together}) == 2  # type: ignore[union-attr]


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _forbidden(name: str):  # type: ignore[no-untyped-def]
    def method(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(f"{name} called: the advice must use one predict_columns call")

    return method


def test_finetwin_advise_reads_yaml_and_json(
    calibrated_models_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(calibrated_models_dir))
    yaml_file = tmp_path / "job.yaml"
    yaml_file.write_text("".join(f"{k}: {v}\n" for k, v in JOB.items()))
    assert main(["advise", str(yaml_file)]) == 0
    text = capsys.readouterr().out
    assert "verdict:" in text and "best throughput:" in text and "fast_kernels: yes" in text
    assert "confidence high: runs with probability at least" in text and "next-safest:" in text
    json_file = tmp_path / "job.json"
    json_file.write_text(json.dumps(JOB))
    assert main(["advise", str(json_file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["gpu_model"] == "NVIDIA-A100-SXM4-80GB"
    # --models, as every other command that predicts takes it ("No such option" before).
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "no-models"))
    assert main(["advise", str(json_file)]) == 2
    assert "no calibrated models yet in" in capsys.readouterr().err
    assert main(["advise", str(json_file), "--json", "--models", str(calibrated_models_dir)]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["gpu_model"] == "NVIDIA-A100-SXM4-80GB"


SAFE_JOBS = [
    JOB,
    {**JOB, "batch_size": 6},  # rejected: repaired
    {**JOB, "model_name": "llama3-70b", "method": "full", "number_gpus": 2, "batch_size": 64},
    {**JOB, "model_name": "mixtral-8x7b-instruct-v0.1", "number_gpus": 16},
    {**JOB, "model_name": "llama3-70b", "method": "full", "number_gpus": 3, "batch_size": 32},  # rejected
]


def _options(answer: object) -> list[object]:
    return [o for o in (answer.fewest_gpus, answer.best_throughput, answer.best_cost) if o is not None]  # type: ignore[attr-defined]


@pytest.mark.parametrize("threshold", [0.9, 0.97])
def test_no_recommendation_below_the_lower_bound_and_a_safer_alternative_beside_it(
    client: TestClient, threshold: float
) -> None:
    version, models = client.app.state.runtime.models_in_use.get()  # type: ignore[attr-defined]
    jobs = [AdviceRequest.model_validate(body).to_job() for body in SAFE_JOBS]
    answers = advise_many(jobs, models, model_version=version, min_p_valid_low=threshold)
    alternatives = 0
    for answer in answers:
        for option in _options(answer):
            low = option.prediction.p_valid_low  # type: ignore[attr-defined]
            assert low is not None and threshold <= low <= option.prediction.p_valid  # type: ignore[attr-defined]
            assert option.confidence.startswith("high")  # type: ignore[attr-defined]
            alternative = option.alternative  # type: ignore[attr-defined]
            if alternative is not None:
                alternatives += 1
                assert alternative.prediction.p_valid_low >= threshold
                assert alternative.config != option.config  # type: ignore[attr-defined]
        repair = answer.repair  # type: ignore[union-attr]
        if repair is not None:
            low = repair.prediction.p_valid_low
            assert repair.confident == (low >= threshold and repair.prediction.p_valid >= 0.7)
            if repair.alternative is not None:
                assert repair.alternative.prediction.p_valid_low >= threshold
            if not repair.confident:
                assert repair.confidence.startswith("low")
    assert alternatives > 0


def test_a_stricter_bound_never_recommends_a_less_safe_fewest_gpus(client: TestClient) -> None:
    """Point-estimate ranking (threshold 0) can pick a configuration the bound would refuse; the bound's
    choice is then one with at least as high a lower bound."""
    version, models = client.app.state.runtime.models_in_use.get()  # type: ignore[attr-defined]
    jobs = [AdviceRequest.model_validate(body).to_job() for body in SAFE_JOBS]
    before = advise_many(jobs, models, model_version=version, min_p_valid_low=0.0)
    after = advise_many(jobs, models, model_version=version)
    for old, new in zip(before, after, strict=True):
        if new.fewest_gpus is None or old.fewest_gpus is None:  # type: ignore[union-attr]
            continue
        assert new.fewest_gpus.config.number_gpus >= old.fewest_gpus.config.number_gpus  # type: ignore[union-attr]
        if new.fewest_gpus.config != old.fewest_gpus.config:  # type: ignore[union-attr]
            assert old.fewest_gpus.prediction.p_valid_low < RECOMMEND_P_VALID_LOW  # type: ignore[union-attr]


def test_the_answer_states_its_confidence_and_alternative_over_http(client: TestClient) -> None:
    response = client.post("/v1/advise", json={**JOB, "batch_size": 6})
    assert response.status_code == 200, response.text
    answer = response.json()
    repair = answer["repair"]
    assert {"confident", "confidence", "alternative"} <= set(repair)
    assert repair["prediction"]["p_valid_low"] <= repair["prediction"]["p_valid"]
    fewest = answer["fewest_gpus"]
    assert fewest["confidence"] and "alternative" in fewest
    assert fewest["prediction"]["p_valid_low"] >= RECOMMEND_P_VALID_LOW
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"confidence", "alternative"} <= set(schemas["Option"]["properties"])
    assert {"confident", "confidence", "alternative"} <= set(schemas["Repair"]["properties"])
    assert "p_valid_low" in schemas["Prediction"]["properties"]


def test_a_configuration_beyond_the_measured_sizes_is_never_recommended_with_confidence(
    client: TestClient,
) -> None:
    """A repair to 1,000,000 GPUs was recommended with "confidence high" (p_valid 1.00) from runs of 1-32:
    an extrapolation, however sure the failure model says it is. It is said to be one, not followed, and
    the closest configuration the models have evidence for is offered instead."""
    asked = client.post("/v1/advise", json=JOB | {"number_gpus": 1_000_000, "batch_size": 16})
    assert asked.status_code == 200, asked.text
    repair = asked.json()["repair"]
    assert repair["confident"] is False and repair["confidence"].startswith("low: beyond the sizes")
    instead = repair["alternative"]
    assert instead is not None and instead["config"]["number_gpus"] <= 32
    assert instead["confidence"].startswith("high"), instead["confidence"]
    for name in ("fewest_gpus", "best_throughput", "best_cost"):  # every option within what was measured
        option = asked.json()[name]
        assert option is None or option["config"]["number_gpus"] <= 32, (name, option)
    # A configuration that passes the rules, beyond the sizes: its verdict says what its p_valid is worth.
    valid = client.post("/v1/advise", json=JOB | {"number_gpus": 64, "batch_size": 64}).json()
    assert valid["verdict"]["status"] == "valid", valid["verdict"]
    assert "beyond the sizes the models learned from" in valid["verdict"]["message"]
    assert any("outside the 1-32 the models learned from" in note for note in valid["notes"])


def test_the_api_starts_on_a_damaged_registry_and_says_it_where_the_model_is_needed(
    sqlite_url: str, registry_copy: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An in-use pointer that is not JSON stopped the API at its start (a RegistryError from the refits'
    first-model check), and the drift check raised it every few seconds."""
    from advisor.app import create_app
    from calibrate.refit import REFIT_NOW_JOB_ID

    pointer = registry_copy / "IN_USE.json"
    pointer.write_text("garbage")
    engine = make_engine(sqlite_url)
    migrate(engine)
    parts = api_parts(advisor_settings(tmp_path, models_dir=registry_copy), engine)
    with TestClient(create_app(parts), headers=api_headers(engine, "viewer")) as client:
        assert client.get("/healthz").status_code == 200
        response = client.post("/v1/advise", json=JOB)
        assert response.status_code == 409  # as for a model in use that fails verification
        assert f"{pointer} cannot be read as JSON" in response.json()["detail"]
        assert parts.refits.check_drift() is False
        assert REFIT_NOW_JOB_ID not in {job.id for job in parts.scheduler.get_jobs()}  # no first fit over it
    assert f"the model registry cannot be read: {pointer} cannot be read as JSON" in caplog.text
    assert pointer.read_text() == "garbage"
