"""Where a backtest's GPU-hours miss comes from: the expected GPU-hours the sources add up to are the twin
ensemble's own mean, and the truth is the backtest's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from calibrate.loader import load_benchmark
from twin.backtest import run_backtest
from twin.backtest_sources import SOURCES, miss_sources
from twin.domain import JobConfig


class CoinFlipModels:
    """Every configuration at exactly 2,000 tokens/s (a band of no width), runs with p_valid 0.5, 300 W: the
    twin's misses are then large, and known in kind (run times, doubted runs, failed runs)."""

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full((len(configs), 3), 2000.0)

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), 0.5)

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), 300.0)


def test_the_sources_add_up_to_the_ensembles_mean_miss(sample_csv: Path) -> None:
    table = load_benchmark(sample_csv).sample(240, random_state=4).reset_index(drop=True)
    sources = miss_sources(table, CoinFlipModels(), seed=3, load=0.7)
    result = run_backtest(table, CoinFlipModels(), runs=1000, seed=3, load=0.7, workers=1)
    figure = result["figures"]["gpu_hours"]
    assert sources.truth_gpu_hours == pytest.approx(figure["truth"], rel=1e-9)
    expected = sources.truth_gpu_hours + sum(sources.gpu_hours.values())
    # The ensemble's mean over 1,000 runs estimates the same expectation (its sampling error is ~0.5 %),
    # and every source weighs: with one of them left out or its sign turned, the sum would be >10 % away.
    assert figure["twin"]["mean"] == pytest.approx(expected, rel=0.02)
    assert set(sources.gpu_hours) == set(SOURCES)
    assert all(
        abs(sources.gpu_hours[s]) > 0.05 * expected for s in ("run_times", "doubted_runs", "failed_runs")
    )
    assert sources.expected_error == pytest.approx(sum(sources.gpu_hours.values()) / figure["truth"])
    # The heaviest jobs are the workload's, largest miss first.
    assert len(sources.heaviest) == 3 and all(job.startswith("bench-") for job, _ in sources.heaviest)
    misses = [abs(hours) for _, hours in sources.heaviest]
    assert misses == sorted(misses, reverse=True) and np.isfinite(misses).all()
