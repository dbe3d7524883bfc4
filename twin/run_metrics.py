"""What one run measured: a summary over the window [0, H] and a series per interval.

Everything is computed after the run from each job's arrival, start and end (vectorized), so the
simulator records nothing per event. Quantities that accumulate over time (busy GPUs, queue length,
energy, failed GPU-hours) are integrated exactly over each interval, not sampled.

Waits: jobs that started in the window, plus jobs still waiting at its end counted with the wait so far
(leaving them out would make a congested forecast look better than it is); per interval likewise, the jobs
that started in it and those still waiting at its end. Jobs already running when the simulation starts
have no wait in the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twin.limits import series_intervals_problem
from twin.plan import JobPlan
from twin.simulator import End, SimResult
from twin.units import JOULES_PER_KWH

SUMMARY_FIGURES = (
    "jobs",
    "jobs_completed",
    "jobs_failed",
    "jobs_rejected",
    "jobs_running_at_end",
    "jobs_queued_at_end",
    "wait_mean_s",
    "wait_p50_s",
    "wait_p95_s",
    "queue_length_mean",
    "utilization",
    "gpu_hours",
    "failed_gpu_hours",
    "energy_kwh",
    "runtime_failure_ratio",
    "makespan_s",
)
SERIES_FIGURES = (
    "queue_length",
    "running_jobs",
    "utilization",
    "wait_p50_s",
    "wait_p95_s",
    "jobs_completed",
    "jobs_failed",
    "runtime_failure_ratio",
    "failed_gpu_hours",
    "energy_kwh",
)


@dataclass
class RunMetrics:
    summary: dict[str, float]
    utilization_by_type: dict[str, float]
    edges_s: np.ndarray  # interval edges, len = intervals + 1
    series: dict[str, np.ndarray]
    utilization_by_type_series: dict[str, np.ndarray]


def integrate_on_bins(
    start: np.ndarray, end: np.ndarray, weight: np.ndarray, edges: np.ndarray
) -> np.ndarray:
    """Per bin, the integral of sum_i weight_i * [start_i <= t < end_i] dt (exact, O((n + bins) log n))."""
    if len(start) == 0:
        return np.zeros(len(edges) - 1)
    keep = end > start
    start, end, weight = start[keep], end[keep], weight[keep]

    def ramp(points: np.ndarray) -> np.ndarray:
        # F(t) = sum_i w_i * max(0, t - p_i), from sorted points and prefix sums.
        order = np.argsort(points)
        p, w = points[order], weight[order]
        cw = np.concatenate([[0.0], np.cumsum(w)])
        cwp = np.concatenate([[0.0], np.cumsum(w * p)])
        k = np.searchsorted(p, edges, side="right")
        return edges * cw[k] - cwp[k]

    return np.diff(ramp(start) - ramp(end))


def measure(
    plan: JobPlan,
    result: SimResult,
    total_gpus_by_type: dict[str, int],
    horizon_s: float | None,
    interval_s: float,
) -> RunMetrics:
    window = float(horizon_s) if horizon_s is not None else max(result.until_s, 0.0)
    outcome = result.outcome
    arrival = plan.arrival_s
    start = result.start_s
    end = result.end_s
    started = ~np.isnan(start)
    ended = ~np.isnan(end)
    initial = ~np.isnan(plan.elapsed_s) & started & (start < 0)

    completed = outcome == End.COMPLETED
    failed = outcome == End.FAILED
    rejected = outcome == End.REJECTED
    queued_at_end = ~started & ~rejected

    waits = np.concatenate([(start - arrival)[started & ~initial], window - arrival[queued_at_end]])
    waits = np.maximum(waits, 0.0)

    run_from = np.where(started, np.maximum(start, 0.0), 0.0)
    run_to = np.where(ended, np.minimum(end, window), window)
    run_to = np.where(started, run_to, 0.0)
    busy = np.maximum(run_to - run_from, 0.0)
    gpu_seconds = busy * plan.gpus
    total_gpus = sum(total_gpus_by_type.values())

    alloc_seconds = busy * result.alloc_gpus
    by_type: dict[str, float] = {}
    for p, name in enumerate(plan.pools):
        capacity = total_gpus_by_type.get(name, 0)
        by_type[name] = (
            float(alloc_seconds[plan.pool == p].sum() / (capacity * window)) if capacity * window else 0.0
        )

    finished = int(completed.sum() + failed.sum())
    queue_from = np.maximum(arrival, 0.0)
    queue_to = np.where(started, start, np.where(rejected, queue_from, window))
    summary = {
        "jobs": float(len(plan)),
        "jobs_completed": float(completed.sum()),
        "jobs_failed": float(failed.sum()),
        "jobs_rejected": float(rejected.sum()),
        "jobs_running_at_end": float((started & ~ended).sum()),
        "jobs_queued_at_end": float(queued_at_end.sum()),
        "wait_mean_s": float(waits.mean()) if len(waits) else 0.0,
        "wait_p50_s": float(np.quantile(waits, 0.5)) if len(waits) else 0.0,
        "wait_p95_s": float(np.quantile(waits, 0.95)) if len(waits) else 0.0,
        "queue_length_mean": float(np.maximum(np.minimum(queue_to, window) - queue_from, 0).sum() / window)
        if window
        else 0.0,
        "utilization": float(alloc_seconds.sum() / (total_gpus * window)) if total_gpus * window else 0.0,
        "gpu_hours": float(gpu_seconds.sum() / 3600.0),
        "failed_gpu_hours": float(gpu_seconds[failed].sum() / 3600.0),
        "energy_kwh": float((gpu_seconds * plan.power_w).sum() / JOULES_PER_KWH),
        "runtime_failure_ratio": float(failed.sum() / finished) if finished else 0.0,
        "makespan_s": float(np.nanmax(end)) if ended.any() else 0.0,
    }

    edges = _edges(window, interval_s)
    series, series_by_type = _series(
        plan, result, edges, run_from, run_to, queue_from, queue_to, total_gpus_by_type, initial
    )
    return RunMetrics(summary, by_type, edges, series, series_by_type)


def _edges(window: float, interval_s: float) -> np.ndarray:
    if window <= 0:
        return np.array([0.0, 0.0])
    problem = series_intervals_problem(window, interval_s)
    if problem is not None:  # a horizon taken from the jobs' own span: known only now
        raise ValueError(f"the series cannot be made: {problem}")
    count = max(1, int(np.ceil(window / interval_s - 1e-9)))
    return np.minimum(np.arange(count + 1) * float(interval_s), window)


def _series(
    plan: JobPlan,
    result: SimResult,
    edges: np.ndarray,
    run_from: np.ndarray,
    run_to: np.ndarray,
    queue_from: np.ndarray,
    queue_to: np.ndarray,
    total_gpus_by_type: dict[str, int],
    initial: np.ndarray,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    width = np.diff(edges)
    safe = np.where(width > 0, width, 1.0)
    outcome = result.outcome
    failed = outcome == End.FAILED
    completed = outcome == End.COMPLETED
    total = sum(total_gpus_by_type.values())

    alloc = result.alloc_gpus.astype(float)
    busy_alloc = integrate_on_bins(run_from, run_to, alloc, edges)
    by_type: dict[str, np.ndarray] = {}
    for p, name in enumerate(plan.pools):
        mask = plan.pool == p
        capacity = total_gpus_by_type.get(name, 0)
        integral = integrate_on_bins(run_from[mask], run_to[mask], alloc[mask], edges)
        by_type[name] = integral / (capacity * safe) if capacity else np.zeros(len(width))

    gpus = plan.gpus.astype(float)
    failed_gpu_s = integrate_on_bins(run_from[failed], run_to[failed], gpus[failed], edges)
    energy_j = integrate_on_bins(run_from, run_to, gpus * plan.power_w, edges)
    queue = integrate_on_bins(queue_from, np.minimum(queue_to, edges[-1]), np.ones(len(plan)), edges)
    running = integrate_on_bins(run_from, run_to, np.ones(len(plan)), edges)

    end = result.end_s
    bins = len(width)
    completed_count = _count_in_bins(end[completed], edges)
    failed_count = _count_in_bins(end[failed], edges)
    finished = completed_count + failed_count

    started = ~np.isnan(result.start_s) & ~initial
    never_queued = initial | (outcome == End.REJECTED)
    p50, p95 = wait_quantiles(plan.arrival_s, np.where(started, result.start_s, np.nan), edges, never_queued)
    series = {
        "queue_length": queue / safe,
        "running_jobs": running / safe,
        "utilization": busy_alloc / (total * safe) if total else np.zeros(bins),
        "wait_p50_s": p50,
        "wait_p95_s": p95,
        "jobs_completed": completed_count,
        "jobs_failed": failed_count,
        "runtime_failure_ratio": np.where(finished > 0, failed_count / np.maximum(finished, 1), np.nan),
        "failed_gpu_hours": failed_gpu_s / 3600.0,
        "energy_kwh": energy_j / JOULES_PER_KWH,
    }
    return series, by_type


def wait_quantiles(
    submitted: np.ndarray, started: np.ndarray, edges: np.ndarray, never_queued: np.ndarray,
    left: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per interval between `edges`, the median and 95th percentile of the waits of the jobs that started in
    it (`started`, NaN for none) and of the jobs still waiting at its end, at their wait so far; NaN where
    there is neither. Jobs marked `never_queued` (rejected, or running before the window) count for none.
    `left`: when each job left the queue, where that is not its start (a recorded job that ended without a
    recorded start waits no more after its end); NaN for none.

    The waiting jobs' wait so far is a lower bound of their wait, so an interval in which a stuck queue
    starts nothing misses a wait objective; counting only the jobs that started made it an interval without
    data, and a cluster that started nothing at all looked no worse than one that started its jobs late."""
    bins = len(edges) - 1
    known = ~never_queued & ~np.isnan(submitted)
    begun = known & ~np.isnan(started) & (started >= edges[0]) & (started <= edges[-1])
    slot = np.clip(np.searchsorted(edges, started[begun], side="right") - 1, 0, bins - 1)
    waits = (started - submitted)[begun]
    ends = edges[1:]
    leaves = started if left is None else left
    start = np.where(np.isnan(leaves), np.inf, leaves)
    first = np.searchsorted(ends, submitted, side="left")  # the first end at or after its submission
    past = np.searchsorted(ends, start, side="left")  # the ends before its start
    count = np.where(known, np.maximum(past - first, 0), 0)
    if count.any():
        jobs = np.repeat(np.arange(len(count)), count)
        # Each job's run of interval indices first..past-1, laid end to end.
        waiting = np.arange(len(jobs)) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
        slot = np.concatenate([slot, waiting])
        waits = np.concatenate([waits, np.maximum(ends[waiting] - submitted[jobs], 0.0)])
    order = np.argsort(slot, kind="stable")
    slot, waits = slot[order], waits[order]
    bounds = np.searchsorted(slot, np.arange(bins + 1))
    p50, p95 = chunk_quantiles(waits, bounds, (0.5, 0.95))
    return p50, p95


def chunk_quantiles(values: np.ndarray, bounds: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """Per chunk `values[bounds[b]:bounds[b + 1]]`, its quantiles at `levels` (NumPy's default method), NaN
    for an empty chunk: a row per level. The chunks of one length are taken at once, each a row of one
    array, which gives the floats of one `np.quantile` per chunk (tests/twin/test_spread.py); that cost
    25 us a chunk, 2.4 s of a run's metrics over a day of one-second intervals."""
    starts, sizes = bounds[:-1], np.diff(bounds)
    out = np.full((len(levels), len(sizes)), np.nan)
    for size in np.unique(sizes[sizes > 0]):
        chunks = np.flatnonzero(sizes == size)
        rows = values[starts[chunks, None] + np.arange(size)]
        out[:, chunks] = np.quantile(rows, levels, axis=1)
    return out


def _count_in_bins(times: np.ndarray, edges: np.ndarray) -> np.ndarray:
    times = times[(times >= edges[0]) & (times <= edges[-1])]
    counts, _ = np.histogram(times, bins=edges) if edges[-1] > edges[0] else (np.zeros(len(edges) - 1), None)
    return counts.astype(float)


def energy_if_run(plan: JobPlan, subset: np.ndarray) -> float:
    """kWh the jobs of `subset` (a boolean mask in plan order) would draw if each ran to completion: its
    drawn run at its power, also where this run drew its failure instead (a backtest's measured energy is of
    runs that completed, so the twin's figure for them is conditional on their completing)."""
    if plan.run_s is None:
        raise ValueError("the plan has no drawn runs")
    ran = subset & (plan.run_s > 0)  # a rejected job draws nothing (and has no power)
    return float((plan.run_s[ran] * plan.gpus[ran] * plan.power_w[ran]).sum() / JOULES_PER_KWH)
