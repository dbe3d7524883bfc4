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
from calibrate.splits import BLOCK, GPU_OUT, RANDOM, block_folds, leave_one_group_out, random_holdout
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


def test_leave_one_gpu_out_holds_out_every_row_of_one_gpu_type_at_a_time(sample: pd.DataFrame) -> None:
    """Issue 14, point 2: the split a provider meets when it adds a GPU type."""
    folds = leave_one_group_out(sample, "gpu_model", GPU_OUT)
    gpus = sample["gpu_model"].astype(str).to_numpy()
    assert sorted(gpus[f.test[0]] for f in folds) == sorted(set(gpus))
    for fold in folds:
        held_out = set(gpus[fold.test])
        assert len(held_out) == 1 and held_out.isdisjoint(gpus[fold.train])
        assert len(fold.train) + len(fold.test) == len(sample)
    assert leave_one_group_out(sample, "gpu_model", GPU_OUT, min_rows=len(sample) + 1) == []


def test_interval_score_adds_twice_over_alpha_the_miss_to_the_width() -> None:
    """Issue 14, point 1: Winkler's score, relative to the actual value; a narrow band that misses costs
    more than a wide one that holds the truth."""
    actual = np.array([100.0, 100.0])
    inside = accuracy.interval_score(actual, np.array([90.0, 95.0]), np.array([110.0, 105.0]), alpha=0.2)
    assert inside == pytest.approx((0.2 + 0.1) / 2)
    missed = accuracy.interval_score(actual, np.array([101.0, 101.0]), np.array([103.0, 103.0]), alpha=0.2)
    assert missed == pytest.approx(0.02 + 10 * 0.01)
    assert accuracy.median_relative_width(np.array([90.0, 80.0]), np.array([100.0, 100.0]),
                                          np.array([110.0, 140.0])) == pytest.approx(0.4)  # fmt: skip
