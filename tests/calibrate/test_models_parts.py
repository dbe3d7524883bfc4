"""Splits and metrics, the building blocks of `holdout_metrics` and `bench/accuracy.py`, and the feature
physics the models rely on."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from advisor.routers.models import ConfigIn
from calibrate import accuracy
from calibrate.config_frame import configs_to_frame, records_to_frame
from calibrate.features import FEATURE_NAMES, build_features
from calibrate.loader import load_benchmark
from calibrate.splits import BLOCK, RANDOM, block_folds, random_holdout
from ingest.events import JobSubmitted
from twin.domain import JobConfig, gpu_type
from twin.job_config import CONFIG_FIELDS, config_from_row


@pytest.fixture(scope="module")
def sample(sample_csv) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    return load_benchmark(sample_csv)


def test_a_random_holdout_is_a_seeded_15_percent_partition(sample: pd.DataFrame) -> None:
    split = random_holdout(sample, seed=7)
    assert split.kind == RANDOM
    assert len(split.test) == round(len(sample) * 0.15)
    assert np.intersect1d(split.train, split.test).size == 0
    assert np.union1d(split.train, split.test).size == len(sample)
    again = random_holdout(sample, seed=7)
    assert np.array_equal(split.test, again.test)
    assert not np.array_equal(split.test, random_holdout(sample, seed=8).test)


def test_block_folds_hold_out_each_contiguous_stretch_of_the_file_once(sample: pd.DataFrame) -> None:
    shuffled = sample.sample(frac=1.0, random_state=0)  # blocks follow the file's lines, not the row order
    folds = block_folds(shuffled, n_blocks=10)
    assert [f.kind for f in folds] == [BLOCK] * 10
    held_out = np.concatenate([f.test for f in folds])
    assert np.array_equal(np.sort(held_out), np.arange(len(shuffled)))
    for fold in folds:
        lines = np.sort(shuffled["line"].to_numpy()[fold.test])
        assert np.all(np.diff(lines) == 1)  # one unbroken range of lines
        assert np.intersect1d(fold.train, fold.test).size == 0


def test_metrics_on_known_values() -> None:
    actual = np.array([100.0, 200.0, 400.0])
    predicted = np.array([110.0, 150.0, 400.0])
    assert accuracy.mdape(actual, predicted) == pytest.approx(0.10)
    assert accuracy.mape(actual, predicted) == pytest.approx((0.10 + 0.25 + 0.0) / 3)
    assert accuracy.band_coverage(actual, actual * 0.9, np.array([120.0, 190.0, 500.0])) == pytest.approx(
        2 / 3
    )
    truth = np.array([True, True, True, False])
    assert accuracy.balanced_accuracy(truth, np.array([True, True, False, False])) == pytest.approx(
        (2 / 3 + 1) / 2
    )
    assert accuracy.brier_score(truth, np.array([1.0, 0.5, 1.0, 0.0])) == pytest.approx(0.25 / 4)
    assert accuracy.exact_share(np.array(["a", None]), np.array(["a", None])) == 1.0
    # One class present: that class's recall; nothing to score: NaN.
    assert accuracy.balanced_accuracy(np.array([True, True]), np.array([True, False])) == 0.5
    assert math.isnan(accuracy.balanced_accuracy(np.array([], dtype=bool), np.array([], dtype=bool)))
    assert math.isnan(accuracy.brier_score(np.array([]), np.array([])))
    with pytest.raises(ValueError, match="positive"):
        accuracy.mdape(np.array([0.0]), np.array([1.0]))


def test_training_and_serving_build_identical_features_for_the_same_config(sample: pd.DataFrame) -> None:
    """Training reads benchmark rows; serving reads the same configurations as JobConfigs (the twin, the
    advisor), telemetry payloads (live predictions), API bodies (/v1/predict): one converter, one answer.
    The serving forms carry no `time_limit_s`: the time cap must come from `experiment_id`, as the loader
    reads it, and GPU names in another spelling must not matter."""
    rows = sample.iloc[::40]
    assert rows["time_limit_s"].notna().any() and rows["time_limit_s"].isna().any()
    from_rows, _ = build_features(rows)
    assert list(from_rows.columns) == list(FEATURE_NAMES)
    records = [r.to_dict() for _, r in rows.iterrows()]
    descriptors = ("experiment_id", "identifier", "fms_hf_tuning_version", "torch_dtype")
    payloads = [
        {**{name: _plain(r[name]) for name in (*CONFIG_FIELDS, *descriptors) if name != "time_limit_s"}}
        for r in records
    ]
    for payload in payloads[::2]:
        payload["gpu_model"] = gpu_type(payload["gpu_model"]).short.lower()  # "a100-sxm"
    served = {
        "JobConfig": configs_to_frame([config_from_row(r) for r in records]),
        "telemetry": records_to_frame(JobSubmitted.model_validate(p).model_dump() for p in payloads),
        "API": configs_to_frame([ConfigIn.model_validate(p).to_config() for p in payloads]),
    }
    for path, frame in served.items():
        features, _ = build_features(frame)
        pd.testing.assert_frame_equal(
            from_rows.reset_index(drop=True), features, check_dtype=False, obj=f"features served via {path}"
        )


def _plain(value: object) -> object:
    """A pandas cell as JSON would carry it."""
    return value.item() if isinstance(value, np.generic) else value


def test_sharding_over_more_gpus_shrinks_the_state_per_gpu_and_grows_the_headroom() -> None:
    configs = [
        JobConfig("llama3.1-70b", "full", "NVIDIA-A100-SXM4-80GB", g, max(1, g // 8), g, 2048)
        for g in (1, 8, 32)
    ]
    features, _ = build_features(configs_to_frame(configs))
    assert np.all(np.diff(features["log_state_gb"]) < 0)
    assert np.all(np.diff(features["memory_headroom_gb"]) > 0)
    lora = build_features(configs_to_frame([configs[0].with_changes(method="lora")]))[0]
    assert lora["log_state_gb"].iloc[0] < features["log_state_gb"].iloc[0] - np.log(7)  # 2 vs 16 bytes/param
