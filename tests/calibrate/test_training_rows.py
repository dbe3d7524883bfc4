"""What a fit learns from: a benchmark row given twice counts once, and an observed run no hardware makes
is left out; each said in the version's `left_out`."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from calibrate.dataset import WeightPolicy, assemble
from calibrate.loader import load_benchmark
from calibrate.observed import OBSERVED_SOURCE, implausible_runs
from twin.domain import Outcome

NOW = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def sample(sample_csv) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    table = load_benchmark(sample_csv)
    table["source"] = "benchmark:sample.csv"
    return table


def test_a_benchmark_row_given_twice_is_learned_from_once(sample: pd.DataFrame) -> None:
    """The same file twice made every held-out row its own neighbour: band coverage 66 % against 87 %."""
    once = assemble([sample], None, now=NOW, policy=WeightPolicy())
    twice = assemble([sample, sample.copy()], None, now=NOW, policy=WeightPolicy())
    assert len(twice) == len(once) == len(sample) and once.left_out == {}
    assert twice.left_out == {"repeated benchmark rows": len(sample)}
    assert twice.fingerprint == once.fingerprint  # the same rows: nothing new to refit on
    overlapping = pd.concat([sample.iloc[:100], sample.iloc[:100], sample.iloc[100:150]], ignore_index=True)
    partly = assemble([sample.iloc[:120], overlapping], None, now=NOW, policy=WeightPolicy())
    # Of the second file's 250 rows, 200 are the first file's first 100 (twice) and 20 more of its rows.
    assert len(partly) == 150 and partly.left_out == {"repeated benchmark rows": 220}
    assert len(partly.weights) == len(partly.row_hashes) == 150


def observed_runs(sample: pd.DataFrame, count: int) -> pd.DataFrame:
    runs = sample[sample["outcome"] == Outcome.VALID.value].head(count).copy().reset_index(drop=True)
    runs["source"] = OBSERVED_SOURCE
    runs["observed_at"] = pd.Timestamp(NOW)
    return runs


def test_an_observed_run_no_hardware_makes_is_left_out(sample: pd.DataFrame) -> None:
    """One `job.completed` of 1e300 tokens/s, valid to the schema, made the next version predict 4e299."""
    valid = sample[sample["outcome"] == Outcome.VALID.value]
    assert not implausible_runs(valid).any()  # every real run of the benchmark is plausible
    runs = observed_runs(sample, 6)
    runs.loc[1, "dataset_tokens_per_second"] = 1e300
    runs.loc[2, "dataset_tokens_per_second"] = 1e-300
    runs.loc[3, "gpu_power_watts_avg"] = 5000.0
    runs.loc[4, "dataset_tokens_per_second"] *= 20  # fast, but within what the benchmark itself spans
    assert implausible_runs(runs).tolist() == [False, True, True, True, False, False]
    data = assemble([sample], runs, now=NOW, policy=WeightPolicy())
    assert data.left_out == {"implausible observed runs": 3}
    learned = data.table[data.table["source"] == OBSERVED_SOURCE]["dataset_tokens_per_second"].to_numpy()
    assert np.array_equal(learned, runs.loc[[0, 4, 5], "dataset_tokens_per_second"].to_numpy())
    assert len(data.weights) == len(data.table) == len(sample) + 3
