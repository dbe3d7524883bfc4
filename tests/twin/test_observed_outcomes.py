"""Runtime failures before a failure model is calibrated: the uncalibrated fallback follows how the
cluster's own runs ended (`twin.observed_outcomes`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from twin.domain import JobConfig
from twin.observed_outcomes import PRIOR_RUNS, ObservedOutcomes
from twin.uncalibrated import FallbackModels

A100 = "NVIDIA-A100-SXM4-80GB"


def config(batch: int, **extra: str) -> JobConfig:
    return JobConfig(model_name="llama3-8b", method="full", gpu_model=A100, number_gpus=1, number_nodes=1,
                     batch_size=batch, tokens_per_sample=1024, extra=extra)  # fmt: skip


def test_each_configuration_follows_its_own_runs_shrunk_towards_the_clusters_share() -> None:
    fails, runs, unseen = config(64), config(8), config(16)
    outcomes = ObservedOutcomes.of([fails, runs, unseen], np.array([0, 0, 0, 1, 1]), np.arange(5) >= 3)
    assert outcomes is not None and (outcomes.ran, outcomes.failed) == (2, 3)
    cluster = (2 + 1) / (5 + 2)  # Laplace: three in seven
    assert outcomes.cluster_p_valid == pytest.approx(cluster)
    expected = [
        (0 + PRIOR_RUNS * cluster) / (3 + PRIOR_RUNS),  # failed three times of three: likely to fail
        (2 + PRIOR_RUNS * cluster) / (2 + PRIOR_RUNS),  # ran twice of two
        cluster,  # never seen: the cluster's share
    ]
    np.testing.assert_allclose(outcomes.p_valid([fails, runs, unseen]), expected)
    np.testing.assert_allclose(FallbackModels(outcomes).predict_failure([fails, runs, unseen]), expected)


def test_configurations_of_another_protocol_are_counted_apart() -> None:
    plain, capped = config(8), config(8, experiment_id="finetune-v1-capped")
    outcomes = ObservedOutcomes.of([plain, capped], np.array([0, 0]), np.array([False, False]))
    assert outcomes is not None
    p_plain, p_capped = outcomes.p_valid([plain, capped])
    assert p_plain < p_capped == pytest.approx(outcomes.cluster_p_valid)
    assert dataclasses.replace(capped, extra={}) == plain  # JobConfig's own equality leaves `extra` out


def test_without_ended_runs_the_fallback_predicts_no_runtime_failure() -> None:
    assert ObservedOutcomes.of([config(8)], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)) is None
    np.testing.assert_array_equal(FallbackModels().predict_failure([config(8), config(64)]), [1.0, 1.0])
