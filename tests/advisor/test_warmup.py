"""Warming the advice memo with the benchmark's families (advisor.warmup)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from advisor.advice_plan import candidate_rows
from advisor.app import create_app
from advisor.prediction_memo import PredictionMemo
from advisor.warmup import benchmark_families, warm
from calibrate.loader import bundled_benchmark_path, load_benchmark
from finetwin.schema import migrate
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeModels
from tests.conftest import api_headers
from twin.db import make_engine


def test_one_representative_per_family_of_the_benchmark() -> None:
    table = load_benchmark(bundled_benchmark_path())
    families = benchmark_families([bundled_benchmark_path(), bundled_benchmark_path()])  # twice: no repeats
    expected = table[["model_name", "method", "gpu_model", "tokens_per_sample"]].drop_duplicates()
    assert len(families) == len(expected) > 50
    keys = {(f.model_name, f.method, f.gpu_model, f.tokens_per_sample) for f in families}
    assert keys == set(expected.itertuples(index=False, name=None))
    assert all(f.time_limit_s is None and f.fast_moe == 0 and f.number_nodes == 1 for f in families)


def test_warm_predicts_every_familys_rows_and_stops_when_asked() -> None:
    families = benchmark_families([bundled_benchmark_path()])[:10]
    memo = PredictionMemo("v1", max_rows=100_000)
    rows = warm(memo, FakeModels(), families)
    for family in families:
        family_rows, prefetch = candidate_rows(family.with_changes(batch_size=32, number_gpus=4))
        assert all(row in memo._rows for row in family_rows + prefetch)
    assert rows == memo.predicted_rows == len(memo)
    stopped = threading.Event()
    stopped.set()
    assert warm(PredictionMemo("v1", max_rows=100), FakeModels(), families, stopped) == 0


@pytest.fixture
def warming_client(sqlite_url: str, calibrated_models_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    engine = make_engine(sqlite_url)
    migrate(engine)
    settings = advisor_settings(tmp_path, models_dir=calibrated_models_dir, advice_warm_memo=True)
    with TestClient(create_app(settings, engine), headers=api_headers(engine, "viewer")) as c:
        yield c


@pytest.mark.slow
def test_after_the_warm_up_a_new_question_in_a_benchmark_family_needs_no_model_call(
    warming_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = benchmark_families([bundled_benchmark_path()])[:2]
    body = {
        "model_name": first.model_name, "method": first.method, "gpu_model": first.gpu_model,
        "tokens_per_sample": first.tokens_per_sample, "number_gpus": 2, "batch_size": 16,
    }  # fmt: skip
    assert warming_client.post("/v1/advise", json=body).status_code == 200
    memo = warming_client.app.state.prediction_memo  # type: ignore[attr-defined]
    assert memo.warmed.wait(timeout=120), "the warm-up did not finish"
    _version, models = warming_client.app.state.models_in_use.get()  # type: ignore[attr-defined]
    calls: list[int] = []
    original = type(models).predict_frame

    def counting(self, frame, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(frame))
        return original(self, frame, *args, **kwargs)

    monkeypatch.setattr(type(models), "predict_frame", counting)
    other = {
        **body, "model_name": second.model_name, "method": second.method, "gpu_model": second.gpu_model,
        "tokens_per_sample": second.tokens_per_sample, "number_gpus": 8, "batch_size": 64,
        "dataset_tokens": 3e9,
    }  # fmt: skip
    response = warming_client.post("/v1/advise", json=other)
    assert response.status_code == 200, response.text
    assert calls == [] and response.json()["best_throughput"] is not None
