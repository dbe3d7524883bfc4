"""Where a backtest's GPU-hours miss comes from: each held-out job's expected GPU-hours under the twin's
models (an expectation over its throughput error distribution and its p_valid, not a sample of runs), set
against what the job really held, and split by what the twin got wrong:

- run times: a job that ran, at the run time the twin expects if it runs against its measured one;
- doubted runs: a job that ran, for the share (1 - p_valid) of it the twin expected to fail early instead;
- failed runs: a job that failed at runtime, for the share (p_valid) the twin expected it to run;
- failure times: a failed job's early failure, the twin's expected failure time against the drawn one.

The four add up to the expected error (the ensemble's mean error, less its sampling noise), and the jobs
that weigh most name themselves. `bench/fidelity.py` prints them for every held-out split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from twin.backtest import demand_cluster, replay_benchmark
from twin.plan import Reject, band_at, error_z, failure_times, prepare_catalog, within_range
from twin.protocols import JobModels
from twin.simulator import End

# The quantiles a job's throughput is integrated over (midpoints: no infinite tails).
_LEVELS = (np.arange(1000) + 0.5) / 1000
SOURCES = ("run_times", "doubted_runs", "failed_runs", "failure_times")


@dataclass(frozen=True)
class MissSources:
    truth_gpu_hours: float
    gpu_hours: dict[str, float]  # by SOURCES: the twin's expected minus the truth
    heaviest: list[tuple[str, float]]  # (job id, its expected minus its true GPU-hours), largest first

    @property
    def expected_error(self) -> float:
        return sum(self.gpu_hours.values()) / self.truth_gpu_hours if self.truth_gpu_hours else 0.0


def miss_sources(table: pd.DataFrame, models: JobModels, *, seed: int, load: float) -> MissSources:
    """For the workload `twin.backtest.run_backtest(table, models, seed=seed, load=load)` replays."""
    replay = replay_benchmark(table, demand_cluster(table), np.random.default_rng(seed), load)
    workload = replay.workload
    catalog = prepare_catalog(workload.catalog, models)
    idx = workload.config_idx
    runnable = catalog.reject[idx] == Reject.NONE
    expected_run = np.zeros(len(workload))
    rows = np.flatnonzero(runnable)
    if len(rows):
        k = np.repeat(idx[rows], len(_LEVELS))
        band = catalog.throughput[k]
        tokens_per_s = within_range(
            catalog, k, band_at(band, error_z(catalog, k, np.tile(_LEVELS, len(rows)))), band[:, 1]
        )
        limit = catalog.run_limits_s()[k]
        run_s = np.minimum(np.repeat(workload.work_tokens[rows], len(_LEVELS)) / tokens_per_s, limit)
        expected_run[rows] = run_s.reshape(len(rows), -1).mean(axis=1)
    failing_s = float(np.quantile(failure_times(None), _LEVELS).mean())  # what the backtest's twin draws from
    p = catalog.p_valid[idx]
    gpus = workload.gpus.astype(float) / 3600.0
    held = replay.truth_hold_s
    ran = replay.truth_outcome == End.COMPLETED
    failed = replay.truth_outcome == End.FAILED
    per_job = {
        "run_times": np.where(ran, gpus * (expected_run - held), 0.0),
        "doubted_runs": np.where(ran, gpus * (1 - p) * (failing_s - expected_run), 0.0),
        "failed_runs": np.where(failed, gpus * p * (expected_run - failing_s), 0.0),
        "failure_times": np.where(failed, gpus * (failing_s - held), 0.0),
    }
    total = sum(per_job.values())
    order = np.argsort(-np.abs(total))[:3]
    return MissSources(
        truth_gpu_hours=float((gpus * held).sum()),
        gpu_hours={name: float(values.sum()) for name, values in per_job.items()},
        heaviest=[(workload.job_ids[int(j)], float(total[j])) for j in order],
    )
