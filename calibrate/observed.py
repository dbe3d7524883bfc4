"""Runs observed through telemetry, as a benchmark-shaped table, and how much each counts in a fit.

A finished job in the store is a benchmark row: its configuration lives on `jobs`, what it measured on
`observed_runs`. This module joins the two into the loader's columns (plus `outcome`, `rule`, `source` and
`observed_at`) so that the fit cannot tell an observed run from a benchmark row, except by its weight.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Engine, and_, or_
from sqlmodel import col, select

from calibrate.loader import BENCHMARK_COLUMNS, MEASURED_COLUMNS, each_distinct
from twin.domain import Outcome, broken_rules, canonical_gpu_name, run_time_limit
from twin.store import Job, ObservedRun

OBSERVED_SOURCE = "observed"
DEFAULT_DTYPE = "bfloat16"

# A job that failed for a reason other than memory says nothing the failure model predicts.
_MEMORY_FAILURE = "oom"
_CONFIG_FIELDS = (
    "model_name", "method", "gpu_model", "number_gpus", "number_nodes", "batch_size", "tokens_per_sample",
)  # fmt: skip


# The jobs' columns a benchmark row takes, and the run's measured ones the table stores.
_JOB_COLUMNS = (
    "job_id", "state", "failure_reason", "identifier", "experiment_id", "method", "model_name",
    "number_nodes", "gpu_model", "number_gpus", "tokens_per_sample", "batch_size", "enable_roce", "fast_moe",
    "fast_kernels", "fms_hf_tuning_version", "torch_dtype", "time_limit_s", "ended_at", "updated_at",
)  # fmt: skip
_RUN_COLUMNS = tuple(c for c in MEASURED_COLUMNS if c in ObservedRun.model_fields)


def observed_table(bind: Engine | Connection) -> pd.DataFrame:
    """Every finished job with a known configuration whose outcome the models predict: completed runs
    (valid, with their measured columns), out-of-memory failures (runtime) and rejections (rejected).

    Chosen by the database, read as plain columns and decided column by column: a Job and an ObservedRun
    object per job, a record each, took 25 s for the 333,000 such jobs of a store of 500,000, in the process
    that serves the API, at every hourly refit check.
    """
    measured = col(ObservedRun.dataset_tokens_per_second), col(ObservedRun.train_runtime)
    learnable = or_(
        # A valid run without its throughput is nothing to learn from (NULL or 0, as Python's truth has it).
        and_(col(Job.state) == "completed", *(and_(m.is_not(None), m != 0) for m in measured)),
        col(Job.state) == "rejected",
        # A job that failed for a reason other than memory says nothing the failure model predicts.
        and_(col(Job.state) == "failed", col(Job.failure_reason) == _MEMORY_FAILURE),
    )
    query = (
        select(
            *(getattr(Job, name) for name in _JOB_COLUMNS),
            col(ObservedRun.observed_at).label("run_observed_at"),
            *(getattr(ObservedRun, name) for name in _RUN_COLUMNS),
        )
        .join(ObservedRun, col(ObservedRun.job_id) == col(Job.job_id), isouter=True)
        .where(learnable, *(col(getattr(Job, name)).is_not(None) for name in _CONFIG_FIELDS))
        .order_by(col(Job.job_id))
    )
    if isinstance(bind, Engine):
        with bind.connect() as connection:
            rows = connection.execute(query).all()
    else:
        rows = bind.execute(query).all()
    names = (*_JOB_COLUMNS, "run_observed_at", *_RUN_COLUMNS)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(names)
    cells = {name: np.array(values, dtype=object) for name, values in zip(names, columns, strict=True)}
    valid, runtime = cells["state"] == "completed", cells["state"] == "failed"
    outcome = np.where(
        valid, Outcome.VALID.value, np.where(runtime, Outcome.RUNTIME.value, Outcome.REJECTED.value)
    )
    observed_at = [
        run or ended or updated
        for run, ended, updated in zip(
            cells["run_observed_at"], cells["ended_at"], cells["updated_at"], strict=True
        )
    ]
    table = pd.DataFrame({
        "identifier": [i or f"job_id.{j}" for i, j in zip(cells["identifier"], cells["job_id"], strict=True)],
        "experiment_id": _or(cells["experiment_id"], ""),
        "method": cells["method"],
        "model_name": cells["model_name"],
        "number_nodes": cells["number_nodes"],
        "gpu_model": each_distinct(cells["gpu_model"], canonical_gpu_name),
        "number_gpus": cells["number_gpus"],
        "tokens_per_sample": cells["tokens_per_sample"],
        "batch_size": cells["batch_size"],
        "enable_roce": _truthy(cells["enable_roce"]),
        "fast_moe": _or(cells["fast_moe"], 0),
        "fast_kernels": _truthy(cells["fast_kernels"]),
        "fms_hf_tuning_version": _or(cells["fms_hf_tuning_version"], ""),
        "torch_dtype": _or(cells["torch_dtype"], DEFAULT_DTYPE),
        "time_limit_s": [
            np.nan if (limit := run_time_limit(t, e)) is None else limit
            for t, e in zip(cells["time_limit_s"], cells["experiment_id"], strict=True)
        ],
        "is_valid": valid.astype(np.int64),
        "lh_created_at": [when.isoformat() if when else "" for when in observed_at],
        "rule": broken_rules(
            cells["number_gpus"], cells["batch_size"], _or(cells["fast_moe"], 0), cells["number_nodes"]
        ),
        "outcome": outcome.astype(object),
        "job_id": cells["job_id"],
        "observed_at": observed_at,
        # What a valid run measured; nothing for the others.
        **{name: np.where(valid, cells[name], None) for name in _RUN_COLUMNS},
    }, dtype=None if len(valid) else object)  # fmt: skip  # typed by their values, as records are
    return _frame(table)


def _truthy(values: np.ndarray) -> np.ndarray:
    return np.array([bool(v) for v in values], dtype=bool)


def _or(values: np.ndarray, default: object) -> list[object]:
    return [v or default for v in values]


def _frame(cells: pd.DataFrame) -> pd.DataFrame:
    columns = [*BENCHMARK_COLUMNS, "time_limit_s", "rule", "outcome", "job_id", "observed_at"]
    table = cells.reindex(columns=columns)
    for column in MEASURED_COLUMNS:
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(float)
    gpus = table["number_gpus"].astype(float).replace(0, np.nan)
    # Derived per-GPU columns, as the published file computes them.
    table["dataset_tokens_per_second_per_gpu"] = table["dataset_tokens_per_second"] / gpus
    table["train_tokens_per_gpu_per_second"] = table["train_tokens_per_second"] / gpus
    for column in ("number_nodes", "number_gpus", "tokens_per_sample", "batch_size", "fast_moe", "is_valid"):
        table[column] = table[column].astype(np.int64)
    for column in ("enable_roce", "fast_kernels"):
        table[column] = table[column].astype(bool)
    table["time_limit_s"] = table["time_limit_s"].astype(float)
    table["observed_at"] = pd.to_datetime(table["observed_at"], utc=True)
    table["line"] = -1  # not from a file
    table["source"] = OBSERVED_SOURCE
    return table


# An observed run is left out of a fit when its measured throughput is further than this factor from the
# physics bound (`calibrate.features`), either way: the benchmark's own runs lie within e^-4.2 (1/67) and
# e^3.2 (23x) of it, and a run a thousand times off is a broken measurement, not a fast configuration.
IMPLAUSIBLE_SPEED_FACTOR = 1000.0
# ... or when it drew more power per GPU than this many times its GPU's board power (its TDP caps it).
IMPLAUSIBLE_POWER_FACTOR = 3.0


def implausible_runs(table: pd.DataFrame) -> np.ndarray:
    """Which observed runs (an `observed_table`) measured what no hardware makes: a throughput beyond
    IMPLAUSIBLE_SPEED_FACTOR of the physics bound, or power beyond IMPLAUSIBLE_POWER_FACTOR of the TDP. The
    telemetry's schema takes any finite positive number, and one run of 1e300 tokens/s was learned from."""
    from calibrate.features import feature_columns
    from calibrate.power import tdp_watts

    if not len(table):
        return np.zeros(0, dtype=bool)
    speed = pd.to_numeric(table["dataset_tokens_per_second"], errors="coerce").to_numpy(dtype=float)
    measured = np.isfinite(speed) & (speed > 0)
    off = np.zeros(len(table), dtype=bool)
    if measured.any():
        columns, _ = feature_columns(table[measured])
        ratio = np.abs(np.log(speed[measured]) - columns["log_physics_tokens_per_second"])
        off[measured] = ratio > np.log(IMPLAUSIBLE_SPEED_FACTOR)
    if "gpu_power_watts_avg" in table.columns:
        watts = pd.to_numeric(table["gpu_power_watts_avg"], errors="coerce").to_numpy(dtype=float)
        gpus = np.array([canonical_gpu_name(str(g)) for g in table["gpu_model"]], dtype=object)
        off |= watts > IMPLAUSIBLE_POWER_FACTOR * tdp_watts(gpus)
    return off


def observed_weights(
    observed_at: pd.Series | np.ndarray, now: datetime, *, weight: float, half_life_days: float
) -> np.ndarray:
    """Weight of each observed run relative to a benchmark row (weight 1).

    A fresh run counts `weight` rows; its extra weight halves every `half_life_days`, so an observed run
    always counts at least as much as a benchmark row, and a newer one more than an older one.
    """
    when = pd.to_datetime(pd.Series(observed_at), utc=True)
    age_days = ((pd.Timestamp(now) - when).dt.total_seconds() / 86400.0).clip(lower=0.0).to_numpy()
    age_days = np.nan_to_num(age_days, nan=0.0)
    decay = 0.5 ** (age_days / half_life_days) if half_life_days > 0 else np.ones_like(age_days)
    return 1.0 + (max(weight, 1.0) - 1.0) * decay
