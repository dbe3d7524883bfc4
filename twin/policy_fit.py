"""Which scheduling policy the record shows: the twin's scheduler, run on the cluster's own jobs of a window
with the run times they really had, set against the starts the store recorded.

A forecast's queue is only as right as the policy it assumes (`FINETWIN_FORECAST_POLICY`), and an operator
may not know which of the twin's policies their scheduler is closest to. Here the models' errors are taken
out: the cluster's state at T is rebuilt from the store as a backtest's is (`twin.store_backtest`), the
jobs submitted in (T, T + H] arrive when they did, and every job holds its GPUs for as long as it did (a
job still running at T + H for at least that long, one that never started for as long as the models
draw). The scheduler believes the twin's estimates, the models' median run times (for a job running at T,
its whole estimate less the time it has run: a scheduler does not watch progress). One simulation per
policy, then per policy: how far each job's simulated start lies from its recorded one, over the jobs that
started in either (`compare`), and the queue length at each interval's edge against the recorded one. The
policy whose starts lie nearest is the one the record shows; where several lie as near (a cluster that never
queued: all of them), or no job started, the record does not say.
"""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine

from twin.clock import as_utc
from twin.jsonsafe import json_safe
from twin.plan import JobPlan, Reject, build_plan, prepare_catalog
from twin.policies import Policy
from twin.protocols import JobModels
from twin.randomness import run_key
from twin.rebuild import RebuiltState
from twin.simulator import End, simulate
from twin.store_backtest import LOOKBACK, covered_window
from twin.workload import concat

# Start errors this close to the smallest tie with it: a second is no evidence between policies.
TIE_S = 1.0


def policy_fit(
    engine: Engine,
    models: JobModels,
    *,
    at: datetime,
    horizon_s: float,
    cluster_id: str = "default",
    interval_s: float = 3600.0,
    lookback: timedelta = LOOKBACK,
    seed: int = 0,
) -> dict[str, Any]:
    """Every policy's fit to the record over [at, at + horizon_s]; raises ValueError (saying what the store
    holds) when its telemetry does not cover the window or no node was up at `at`."""
    if not horizon_s > 0:
        raise ValueError("the horizon must be positive")
    if not interval_s > 0:
        raise ValueError("the interval must be positive")
    at = as_utc(at)
    inputs, submitted, states = covered_window(engine, cluster_id, at, horizon_s, lookback)
    workload = concat([inputs.workload, submitted])
    catalog = prepare_catalog(workload.catalog, models)
    key = run_key(np.random.default_rng(seed))
    plan = build_plan(workload, catalog, inputs.cluster, key, inputs.failure_times_s)
    # A scheduler does not watch a job's progress: it believes the estimate it had when the job started
    # (the twin's, from the models' median), less the time run since.
    whole = build_plan(replace(workload, running={}), catalog, inputs.cluster, key, inputs.failure_times_s)
    running = ~np.isnan(plan.elapsed_s)
    plan.estimate_s[running] = np.maximum(whole.estimate_s[running] - plan.elapsed_s[running], 0.0)
    recorded_start = as_recorded(plan, states.after, at, horizon_s)
    edges = np.arange(0.0, horizon_s + interval_s / 2, interval_s)
    edges = edges[edges <= horizon_s]
    recorded_queue = queue_at(plan.arrival_s, recorded_start, plan.reject, edges)
    fits: dict[str, dict[str, Any]] = {}
    for policy in Policy:
        result = simulate(inputs.cluster, plan, policy, until=horizon_s)
        started = np.where(result.outcome == End.REJECTED, np.nan, result.start_s)
        queue = queue_at(plan.arrival_s, started, plan.reject, edges)
        fits[policy.value] = compare(recorded_queue, queue, recorded_start, started, horizon_s)
    nearest = min(_or_inf(fit["start_mae_s"]) for fit in fits.values())
    # Policies whose starts match the record alike (an idle cluster: all of them) are not told apart.
    tied = [name for name, fit in fits.items() if _or_inf(fit["start_mae_s"]) <= nearest + TIE_S]
    best = tied[0] if len(tied) == 1 else None
    return json_safe({
        "at": at.isoformat(),
        "horizon_s": horizon_s,
        "interval_s": interval_s,
        "jobs": len(plan),
        "started_on_record": int(np.isfinite(recorded_start).sum()),
        "policies": fits,
        "best": best,  # None: no job started in the window, or `tied` match the record alike
        "tied": tied if nearest < math.inf else [],
    })  # fmt: skip


def _or_inf(value: float | None) -> float:
    return math.inf if value is None else value


def as_recorded(plan: JobPlan, after: RebuiltState, at: datetime, horizon_s: float) -> np.ndarray:
    """Gives the plan's jobs the run times the store recorded (in place) and returns their recorded starts,
    in seconds from `at` (NaN: not started by the horizon). A job that ended holds its GPUs for as long as it
    did, from when the simulation starts it (a running one for the rest of its run), and fails if it failed;
    one still running at the horizon holds them at least until then; one that never started keeps the
    models' draw. A job the store recorded as rejected, or as ended without a start, is refused (it never
    held a GPU)."""
    start = np.full(len(plan), np.nan)
    for k, job_id in enumerate(plan.job_ids):
        job = after.jobs.get(job_id)
        if job is None:
            continue
        ended = math.inf if job.ended_at is None else (as_utc(job.ended_at) - at).total_seconds()
        left_unstarted = job.started_at is None and ended <= horizon_s
        if job.state == "rejected" or left_unstarted:  # never held a GPU: out of the queues, as refused
            plan.reject[k] = Reject.RULE
            continue
        if job.started_at is None:
            continue
        began = (as_utc(job.started_at) - at).total_seconds()
        if began > horizon_s:
            continue
        start[k] = began
        ran_from = max(began, 0.0)  # a job running at T: the simulation holds it for the rest of its run
        if ended <= horizon_s:
            plan.hold_s[k] = max(ended - ran_from, 0.0)
            plan.fails[k] = job.state == "failed"
        else:
            plan.hold_s[k] = max(plan.hold_s[k], horizon_s - ran_from)
    return start


def queue_at(arrival_s: np.ndarray, start_s: np.ndarray, reject: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Jobs waiting at each edge: arrived by then and not started (NaN start: never), rejected ones aside.
    Counted as arrivals by then less starts by then (a start dated before its arrival, as a skewed clock
    may record it, counts at the arrival), so that a year of hourly edges over a million jobs costs sorting,
    not a matrix of them."""
    waiting = reject == Reject.NONE
    arrived = np.sort(arrival_s[waiting])
    began = np.maximum(start_s[waiting], arrival_s[waiting])
    began = np.sort(began[np.isfinite(began)])
    return (
        np.searchsorted(arrived, edges, side="right") - np.searchsorted(began, edges, side="right")
    ).astype(float)


def compare(
    recorded_queue: np.ndarray,
    queue: np.ndarray,
    recorded_start: np.ndarray,
    start: np.ndarray,
    horizon_s: float,
) -> dict[str, Any]:
    """The queue's error at the edges, and each job's start against its recorded one over the jobs that
    started in either (a start past the horizon, or none, counted at the horizon: a job left waiting is at
    least that late, so a policy that starts fewer jobs is not excused them); jobs running at T aside."""
    counted = (np.isfinite(recorded_start) | np.isfinite(start)) & ~(recorded_start < 0)
    gap = _capped(start[counted], horizon_s) - _capped(recorded_start[counted], horizon_s)
    return {
        "queue_mae": float(np.mean(np.abs(queue - recorded_queue))),
        "queue_bias": float(np.mean(queue - recorded_queue)),
        "start_mae_s": float(np.mean(np.abs(gap))) if len(gap) else None,
        "start_bias_s": float(np.mean(gap)) if len(gap) else None,
        "jobs_compared": int(counted.sum()),
    }


def _capped(start: np.ndarray, horizon_s: float) -> np.ndarray:
    return np.where(np.isnan(start), horizon_s, np.minimum(start, horizon_s))
