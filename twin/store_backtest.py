"""Backtest from the store: the twin started at a past telemetry time T against what the store then recorded.

The state at T is rebuilt from the stored events of the window (`twin.rebuild.backtest_states`): nodes,
queued jobs, running jobs with their progress, and the failure times observed by then. The jobs submitted
in (T, T + H] join as arrivals with their configuration and their declared work, never their outcome or
run time (like the benchmark backtest; `arrivals="model"` draws them from the arrival process learned up to
T instead, as a live forecast does). The caller passes the models that were in use at T.

Truth and twin are measured by the same code (`twin.run_metrics.measure`) over [T, T + H] on the same jobs:
the truth is those jobs' recorded submissions, starts and ends, at their measured power where they
reported one (else what the twin assumes for a job without a power reading). The figures are the
benchmark backtest's: `figures.{name}.truth`, `twin.{mean, p10, p90}`, `error` = (mean - truth) / truth.

Beside the twin, persistence: the same figures of the window before, [T - H, T], measured by the same code,
as the forecast of [T, T + H] that "the next hours will be like the last" makes (`figures.{name}.persistence`,
with its `error`). None where the store's telemetry does not cover that window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine

from twin.clock import as_utc, telemetry_span
from twin.ensemble import relative_error, run_ensemble, spread
from twin.forecast import ForecastOptions, TwinInputs, make_spec
from twin.jsonsafe import json_safe
from twin.live_state import DEFAULT_WORK_TOKENS, _Rows, inputs_from_rows, job_config, typical_work
from twin.plan import JobPlan, Reject, pool_index, recorded_power_w
from twin.policies import Policy
from twin.protocols import JobModels
from twin.rebuild import BacktestStates, RebuiltState, backtest_states
from twin.retention import kept_from
from twin.run_metrics import measure
from twin.simulator import End, SimResult
from twin.slo_attainment import SloSet
from twin.units import duration_text
from twin.workload import Workload, concat

FIGURES = ("jobs_completed", "gpu_hours", "wait_mean_s", "makespan_s", "energy_kwh")
OBSERVED, MODEL = "observed", "model"
LOOKBACK = timedelta(days=7)  # the history before T a backtest learns the arrivals from, as a live forecast


def telemetry_held(cluster_id: str, earliest: datetime | None, latest: datetime | None) -> str:
    """What the store's telemetry of a cluster covers, in words (`twin.clock.telemetry_span`'s result)."""
    if earliest is None or latest is None:
        return f"the store holds no telemetry of cluster {cluster_id!r}"
    return (
        f"the store's telemetry of cluster {cluster_id!r} runs from {earliest.isoformat()} "
        f"to {latest.isoformat()}"
    )


def check_window(
    engine: Engine, cluster_id: str, at: datetime, end: datetime, lookback: timedelta = LOOKBACK
) -> None:
    """Raises ValueError, saying what the store holds, unless the telemetry covers `at` to `end`: before its
    first event the state at T is unknown, and after its last what happened is not in the store yet (the
    truth would read as nothing happening: 0 jobs completed). Nor may the arrivals' window before T start
    before the store's retention horizon (`twin.retention`): the jobs that ended before it are gone from
    the events the window is rebuilt from."""
    earliest, latest = telemetry_span(engine, cluster_id)
    held = telemetry_held(cluster_id, earliest, latest)
    if earliest is None or latest is None:
        raise ValueError(f"{held}: nothing to backtest")
    horizon = kept_from(engine, cluster_id)
    if horizon is not None and at - lookback < horizon:
        raise ValueError(
            f"T ({at.isoformat()}) less the {duration_text(lookback.total_seconds())} of history a backtest "
            f"reads is before "
            f"{horizon.isoformat()}, from which the store keeps cluster {cluster_id!r}'s telemetry "
            f"(FINETWIN_KEEP_TELEMETRY_DAYS): the earliest T is {(horizon + lookback).isoformat()}"
        )
    if at < earliest:
        raise ValueError(f"T ({at.isoformat()}) is before any telemetry: {held}")
    if end > latest:
        raise ValueError(
            f"T + horizon ({end.isoformat()}) is after the newest telemetry, so what happened then is not "
            f"in the store yet: {held}"
        )


def backtest_from_store(
    engine: Engine,
    models: JobModels | None,
    *,
    at: datetime,
    horizon_s: float,
    cluster_id: str = "default",
    runs: int = 8,
    seed: int = 0,
    policy: Policy = Policy.FIFO,
    interval_s: float = 3600.0,
    lookback: timedelta = LOOKBACK,
    arrivals: str = OBSERVED,
    workers: int | None = None,
    model_source: str = "calibrated",
    progress: Callable[[], object] | None = None,
    ray_address: str | None = None,  # run the twin's ensemble on this Ray cluster
) -> dict[str, Any]:
    if horizon_s <= 0:
        raise ValueError("the horizon must be positive")
    if arrivals not in (OBSERVED, MODEL):
        raise ValueError(f"arrivals must be {OBSERVED!r} or {MODEL!r}, not {arrivals!r}")
    at = as_utc(at)
    inputs, observed, states = covered_window(engine, cluster_id, at, horizon_s, lookback)
    before, after = states.before, states.after
    if arrivals == OBSERVED:
        inputs = replace(inputs, workload=concat([inputs.workload, observed]))
    options = ForecastOptions(
        horizon_s=horizon_s, interval_s=interval_s, runs=runs, seed=seed, policy=policy, workers=workers
    )
    spec = make_spec(inputs if arrivals == MODEL else replace(inputs, arrivals=None), models, options,
                     SloSet(slos=[]))  # fmt: skip
    outputs = run_ensemble(spec, runs, workers, progress, ray_address=ray_address)
    truth = truth_figures(inputs, after, at, horizon_s, interval_s, arrivals == OBSERVED)
    baseline = persistence_figures(engine, cluster_id, at, horizon_s, interval_s, lookback)
    figures: dict[str, Any] = {}
    for name in FIGURES:
        forecast = spread([o.summary[name] for o in outputs])
        actual = truth[name]
        mean = forecast["mean"]
        previous = None if baseline is None else baseline[name]
        figures[name] = {
            "truth": actual,
            "twin": forecast,
            "error": relative_error(mean, actual),
            "persistence": {"value": previous, "error": relative_error(previous, actual)},
        }
    return json_safe(
        {
            "at": at.isoformat(),
            "horizon_s": horizon_s,
            "arrivals": arrivals,
            "jobs_at_start": {
                "running": len(inputs.workload.running),
                "queued": int(np.sum(inputs.workload.arrival_s <= 0)) - len(inputs.workload.running),
            },
            "jobs_in_window": int(truth["jobs"]),
            "runs": runs,
            "seed": seed,
            "policy": str(policy),
            "models": model_source,
            "cluster": inputs.cluster.describe(),
            "observed_failure_times": len(before.failures),
            "notes": inputs.notes,
            "figures": figures,
        }
    )


def covered_window(
    engine: Engine, cluster_id: str, at: datetime, horizon_s: float, lookback: timedelta
) -> tuple[TwinInputs, Workload, BacktestStates]:
    """`_rebuilt_window` over [at, at + horizon_s], after `check_window`; ValueError (what the store holds, or
    that no node was up at `at`) where there is nothing to compare."""
    check_window(engine, cluster_id, at, at + timedelta(seconds=horizon_s), lookback)
    window = _rebuilt_window(engine, cluster_id, at, at + timedelta(seconds=horizon_s), lookback)
    if window is None:
        raise ValueError(f"no node of cluster {cluster_id!r} was up at {at.isoformat()}: nothing to compare")
    return window


def persistence_figures(
    engine: Engine, cluster_id: str, at: datetime, horizon_s: float, interval_s: float, lookback: timedelta
) -> dict[str, float] | None:
    """The window before T's figures, [T - H, T], measured as the truth of [T, T + H] is (the jobs queued
    or running at T - H and those submitted after it): what persistence forecasts. None where the store's
    telemetry does not cover that window, or no node was up at its start."""
    try:
        prior = at - timedelta(seconds=horizon_s)
        inputs, submitted, states = covered_window(engine, cluster_id, prior, horizon_s, lookback)
    except (ValueError, OverflowError):
        return None
    inputs = replace(inputs, workload=concat([inputs.workload, submitted]))
    return truth_figures(inputs, states.after, prior, horizon_s, interval_s, True)


def _rebuilt_window(
    engine: Engine, cluster_id: str, at: datetime, end: datetime, lookback: timedelta
) -> tuple[TwinInputs, Workload, BacktestStates] | None:
    """The twin's inputs at `at`, rebuilt from the store; the jobs submitted in (at, end] as observed
    arrivals; and the states they come from. None when no node of the cluster was up at `at`."""
    states = backtest_states(engine, cluster_id, at, end, lookback)
    if not any(n.status == "up" for n in states.before.nodes):
        return None
    rows = states.before.rows(states.since)
    inputs = inputs_from_rows(rows, cluster_id=cluster_id, now=at, since=states.since, notes=[])
    typical = typical_work(rows.history, rows.observed_work) or DEFAULT_WORK_TOKENS
    return inputs, _arrivals(states.before, states.after, at, end, typical), states


def _arrivals(
    before: RebuiltState, after: RebuiltState, at: datetime, end: datetime, typical: float
) -> Workload:
    """The jobs submitted in (at, end], as the twin would have learned of them: configuration and declared
    work (dataset tokens; else `typical`, what a forecast at `at` assumes), never how they went."""
    rows = _Rows()
    for job in sorted(after.jobs.values(), key=lambda j: (j.submitted_at or end, j.job_id)):
        if job.submitted_at is None or not (at < job.submitted_at <= end) or job.job_id in before.jobs:
            continue
        config = job_config(job)
        if config is None:
            continue
        work = float(job.dataset_tokens) if job.dataset_tokens and job.dataset_tokens > 0 else typical
        rows.add(job.job_id, (job.submitted_at - at).total_seconds(), config, work, None)
    return rows.build()


def truth_figures(
    inputs: TwinInputs, after: RebuiltState, at: datetime, horizon_s: float, interval_s: float, counted: bool
) -> dict[str, float]:
    """The window's figures from what the store recorded for the twin's jobs (the ones queued or running at
    `at`, and with observed arrivals the ones submitted after it)."""
    workload = inputs.workload
    ids = [j for j in workload.job_ids]
    if not counted:  # model arrivals: the truth's arrivals are the recorded submissions in the window
        end = at + timedelta(seconds=horizon_s)
        extra = [
            j.job_id for j in after.jobs.values()
            if j.submitted_at is not None and at < j.submitted_at <= end and job_config(j) is not None
        ]  # fmt: skip
        ids = ids + sorted(set(extra) - set(ids))
    jobs = [after.jobs[j] for j in ids]
    seconds = _seconds_from(at)
    arrival = np.array([seconds(j.submitted_at) for j in jobs])
    start = np.array([seconds(j.started_at) for j in jobs])
    end_s = np.array([seconds(j.ended_at) for j in jobs])
    start = np.where(start > horizon_s, np.nan, start)
    end_s = np.where(end_s > horizon_s, np.nan, end_s)
    outcome = np.full(len(jobs), End.PENDING.value, dtype=np.int8)
    for k, job in enumerate(jobs):
        if math.isnan(end_s[k]):
            continue
        outcome[k] = {"completed": End.COMPLETED, "failed": End.FAILED, "rejected": End.REJECTED}.get(
            job.state, End.PENDING
        )
    gpus = np.array([int(j.number_gpus or 0) for j in jobs], dtype=np.int64)
    power = np.array([_power(after, j) for j in jobs])
    shell = Workload(
        job_ids=ids, arrival_s=arrival, gpus=gpus, gpu_models=[j.gpu_model or "" for j in jobs],
        duration_s=np.zeros(len(jobs)), work_tokens=np.zeros(len(jobs)),
        config_idx=np.full(len(jobs), -1, dtype=np.int64),
    )  # fmt: skip
    pool, pools, _ = pool_index(shell, inputs.cluster)
    elapsed = np.where(start < 0, -start, np.nan)
    plan = JobPlan(
        job_ids=ids, row=np.arange(len(jobs)), arrival_s=arrival, gpus=gpus, pool=pool, pools=pools,
        hold_s=np.zeros(len(jobs)), fails=outcome == End.FAILED, estimate_s=np.zeros(len(jobs)),
        power_w=power, reject=np.where(outcome == End.REJECTED, Reject.RULE, Reject.NONE).astype(np.int8),
        elapsed_s=elapsed,
    )  # fmt: skip
    result = SimResult(start_s=start, end_s=end_s, outcome=outcome, alloc_gpus=gpus, until_s=horizon_s)
    metrics = measure(plan, result, inputs.cluster.gpus_by_model(), horizon_s, interval_s)
    return metrics.summary


def _seconds_from(origin: datetime) -> Callable[[datetime | None], float]:
    def seconds(ts: datetime | None) -> float:
        return float("nan") if ts is None else (as_utc(ts) - origin).total_seconds()

    return seconds


def _power(state: RebuiltState, job: Any) -> float:
    return recorded_power_w(state.observed_power_w.get(job.job_id), job.last_power_watts, job.gpu_model or "")
