"""Runs observed through telemetry, as a benchmark-shaped table, and how much each counts in a fit.

A finished job in the store is a benchmark row: its configuration lives on `jobs`, what it measured on
`observed_runs`. This module joins the two into the loader's columns (plus `outcome`, `rule`, `source` and
`observed_at`) so that the fit cannot tell an observed run from a benchmark row, except by its weight.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
from sqlalchemy import Connection, Engine
from sqlmodel import Session, select

from calibrate.loader import BENCHMARK_COLUMNS, MEASURED_COLUMNS
from twin.domain import Outcome, broken_rule, canonical_gpu_name
from twin.store import Job, ObservedRun

OBSERVED_SOURCE = "observed"
DEFAULT_DTYPE = "bfloat16"

# A job that failed for a reason other than memory says nothing the failure model predicts.
_MEMORY_FAILURE = "oom"
_CONFIG_FIELDS = (
    "model_name", "method", "gpu_model", "number_gpus", "number_nodes", "batch_size", "tokens_per_sample",
)  # fmt: skip


def observed_table(bind: Engine | Connection) -> pd.DataFrame:
    """Every finished job with a known configuration whose outcome the models predict: completed runs
    (valid, with their measured columns), out-of-memory failures (runtime) and rejections (rejected)."""
    query = (
        select(Job, ObservedRun)
        .join(ObservedRun, ObservedRun.job_id == Job.job_id, isouter=True)  # type: ignore[arg-type]
        .where(Job.state.in_(("completed", "failed", "rejected")))  # type: ignore[attr-defined]
        .where(Job.model_name.is_not(None))  # type: ignore[union-attr]
        .order_by(Job.job_id)
    )
    with Session(bind) as session:
        rows = session.exec(query).all()  # type: ignore[call-overload]
    records = [record for job, run in rows if (record := _record(job, run)) is not None]
    return _frame(records)


def _record(job: Job, run: ObservedRun | None) -> dict[str, object] | None:
    if any(getattr(job, name) is None for name in _CONFIG_FIELDS):
        return None
    rule = broken_rule(job.number_gpus, job.batch_size, job.fast_moe or 0, job.number_nodes)  # type: ignore[arg-type]
    if job.state == "completed":
        if run is None or not run.dataset_tokens_per_second or not run.train_runtime:
            return None  # a valid run without its throughput is nothing to learn from
        outcome = Outcome.VALID
    elif job.state == "rejected":
        outcome = Outcome.REJECTED
    elif job.failure_reason == _MEMORY_FAILURE:
        outcome = Outcome.RUNTIME
    else:
        return None
    observed_at = (run.observed_at if run is not None else None) or job.ended_at or job.updated_at
    record: dict[str, object] = {
        "identifier": job.identifier or f"job_id.{job.job_id}",
        "experiment_id": job.experiment_id or "",
        "method": job.method,
        "model_name": job.model_name,
        "number_nodes": job.number_nodes,
        "gpu_model": canonical_gpu_name(job.gpu_model),  # type: ignore[arg-type]
        "number_gpus": job.number_gpus,
        "tokens_per_sample": job.tokens_per_sample,
        "batch_size": job.batch_size,
        "enable_roce": bool(job.enable_roce),
        "fast_moe": int(job.fast_moe or 0),
        "fast_kernels": bool(job.fast_kernels),
        "fms_hf_tuning_version": job.fms_hf_tuning_version or "",
        "torch_dtype": job.torch_dtype or DEFAULT_DTYPE,
        "time_limit_s": job.time_limit_s if job.time_limit_s is not None else np.nan,
        "is_valid": int(outcome == Outcome.VALID),
        "lh_created_at": observed_at.isoformat() if observed_at else "",
        "rule": rule.value if rule is not None else None,
        "outcome": outcome.value,
        "job_id": job.job_id,
        "observed_at": observed_at,
    }
    if outcome == Outcome.VALID and run is not None:
        for column in MEASURED_COLUMNS:
            record[column] = getattr(run, column, None)
    return record


def _frame(records: list[dict[str, object]]) -> pd.DataFrame:
    columns = [*BENCHMARK_COLUMNS, "time_limit_s", "rule", "outcome", "job_id", "observed_at"]
    table = pd.DataFrame.from_records(records, columns=columns)
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
