"""The observed runs as benchmark rows: read as plain columns, they come out as the per-job reading (kept here
as the reference) made them, cell for cell and type for type, whatever the store holds."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
from sqlalchemy import Engine, insert
from sqlmodel import Session, select

from calibrate.loader import BENCHMARK_COLUMNS, MEASURED_COLUMNS
from calibrate.observed import DEFAULT_DTYPE, _frame, observed_table
from twin.domain import Outcome, broken_rule, canonical_gpu_name
from twin.store import Job, ObservedRun

T0 = datetime(2026, 3, 1, tzinfo=UTC)
GPU_SPELLINGS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "L40S", "h100")
CAPPED_PROTOCOL, CAPPED_AT = "SFTTrainer.x-stop_after_seconds.900.0-optim.adamw", 900.0
CONFIG_FIELDS = (
    "model_name", "method", "gpu_model", "number_gpus", "number_nodes", "batch_size", "tokens_per_sample",
)  # fmt: skip


def reference_observed_table(engine: Engine) -> pd.DataFrame:
    """The reading before it read columns: a Job and an ObservedRun object per finished job, a record each."""
    query = (
        select(Job, ObservedRun)
        .join(ObservedRun, ObservedRun.job_id == Job.job_id, isouter=True)  # type: ignore[arg-type]
        .where(Job.state.in_(("completed", "failed", "rejected")))  # type: ignore[attr-defined]
        .where(Job.model_name.is_not(None))  # type: ignore[union-attr]
        .order_by(Job.job_id)
    )
    with Session(engine) as session:
        rows = session.execute(query).all()
    records = []
    for job, run in rows:
        if any(getattr(job, name) is None for name in CONFIG_FIELDS):
            continue
        rule = broken_rule(job.number_gpus, job.batch_size, job.fast_moe or 0, job.number_nodes)
        if job.state == "completed":
            if run is None or not run.dataset_tokens_per_second or not run.train_runtime:
                continue
            outcome = Outcome.VALID
        elif job.state == "rejected":
            outcome = Outcome.REJECTED
        elif job.failure_reason == "oom":
            outcome = Outcome.RUNTIME
        else:
            continue
        observed_at = (run.observed_at if run is not None else None) or job.ended_at or job.updated_at
        record = {
            "identifier": job.identifier or f"job_id.{job.job_id}", "experiment_id": job.experiment_id or "",
            "method": job.method, "model_name": job.model_name, "number_nodes": job.number_nodes,
            "gpu_model": canonical_gpu_name(job.gpu_model), "number_gpus": job.number_gpus,
            "tokens_per_sample": job.tokens_per_sample, "batch_size": job.batch_size,
            "enable_roce": bool(job.enable_roce), "fast_moe": int(job.fast_moe or 0),
            "fast_kernels": bool(job.fast_kernels), "fms_hf_tuning_version": job.fms_hf_tuning_version or "",
            "torch_dtype": job.torch_dtype or DEFAULT_DTYPE,
            # A protocol that stops after N seconds caps a run telemetry gave no limit, as a benchmark row.
            "time_limit_s": job.time_limit_s
            if job.time_limit_s is not None
            else CAPPED_AT
            if job.experiment_id == CAPPED_PROTOCOL
            else np.nan,
            "is_valid": int(outcome == Outcome.VALID),
            "lh_created_at": observed_at.isoformat() if observed_at else "",
            "rule": rule.value if rule is not None else None, "outcome": outcome.value, "job_id": job.job_id,
            "observed_at": observed_at,
        }  # fmt: skip
        if outcome == Outcome.VALID and run is not None:
            for column in MEASURED_COLUMNS:
                record[column] = getattr(run, column, None)
        records.append(record)
    columns = [*BENCHMARK_COLUMNS, "time_limit_s", "rule", "outcome", "job_id", "observed_at"]
    return _frame(pd.DataFrame.from_records(records, columns=columns))  # the types, as the module gives them


def odd_jobs(count: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Jobs of every kind a store holds, and runs for some: each field drawn from its usual values and its
    edge cases (missing, empty, zero, a broken rule, a whole-second time)."""
    rng = random.Random(seed)
    jobs, runs = [], []
    for i in range(count):
        pick = rng.choice
        ended = pick([None, T0 + timedelta(seconds=i * 37.5), T0 + timedelta(hours=i)])
        job = {
            "job_id": f"j{i:04d}", "state": pick(["completed", "completed", "failed", "rejected", "running"]),
            "failure_reason": pick(["oom", "oom", "other", None]),
            "model_name": pick(["llama3-8b", "granite-3b"] * 4 + [None]),
            "method": pick(["lora", "full"] * 4 + [None]),
            "gpu_model": pick([*GPU_SPELLINGS, *GPU_SPELLINGS, None]),
            "number_gpus": pick([1, 2, 4, 8, 0, -2, 3, None]), "number_nodes": pick([1, 2, 0, 3, None]),
            "batch_size": pick([8, 16, 7, 0, -4, None]), "tokens_per_sample": pick([512, 4096] * 4 + [None]),
            "enable_roce": pick([True, False, None]), "fast_moe": pick([None, 0, 2, 3]),
            "fast_kernels": pick([True, False, None]), "time_limit_s": pick([None, 600.0, 0.0]),
            "identifier": pick([None, "", "id.x"]),
            "experiment_id": pick([None, "", "SFTTrainer.v1", CAPPED_PROTOCOL]),
            "fms_hf_tuning_version": pick([None, "", "3.1.0"]), "torch_dtype": pick([None, "", "float16"]),
            "submitted_at": T0, "ended_at": ended, "updated_at": T0 + timedelta(minutes=i),
        }  # fmt: skip
        jobs.append(job)
        if rng.random() < 0.7:
            measured = {
                c: pick([None, 0.0, 12.5 + i]) for c in MEASURED_COLUMNS if c in ObservedRun.model_fields
            }
            measured |= {"dataset_tokens_per_second": pick([None, 0.0, *[1500.0 + i] * 6]),
                         "train_runtime": pick([None, 0.0, *[600.0 + i] * 6])}  # fmt: skip
            observed = pick([T0 + timedelta(days=1, seconds=i), T0 + timedelta(days=1, microseconds=i + 1)])
            runs.append({"job_id": job["job_id"], "is_valid": 1, "observed_at": observed, **measured})
    return jobs, runs


def test_observed_runs_read_as_columns_equal_the_per_job_reading(engine: Engine) -> None:
    jobs, runs = odd_jobs(600, seed=4)
    with engine.begin() as connection:
        connection.execute(insert(Job), jobs)
        connection.execute(insert(ObservedRun), runs)
    got, want = observed_table(engine), reference_observed_table(engine)
    assert set(got["outcome"]) == {"valid", "runtime", "rejected"}  # every kind of row is there
    assert got["rule"].notna().any() and got["rule"].isna().any()
    assert (got["time_limit_s"] == CAPPED_AT).any()  # some capped by their protocol alone
    pd.testing.assert_frame_equal(got, want)


def test_a_store_without_finished_jobs_gives_an_empty_table_of_the_same_shape(engine: Engine) -> None:
    pd.testing.assert_frame_equal(observed_table(engine), reference_observed_table(engine))
