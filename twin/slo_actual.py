"""SLO attainment as it happened: each declared SLO judged per interval on what the store recorded, by the
definitions a forecast judges its runs by (`twin.run_metrics`, `twin.slo_attainment`), so the two read alike.

Per interval [a, b): the waits of the jobs that started in it and of the jobs still waiting at b, at their
wait so far (`wait_p50_s`, `wait_p95_s`); the jobs that failed at run time over those that finished, by
their end (`runtime_failure_ratio`); utilization (overall or of one GPU type) and the mean queue length as
`twin.actuals` measures them for the forecast's score. An interval without data for a figure (no job
started or waiting; none finished) does not count, as in a forecast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine

from twin.actuals import BY_TYPE, JobTimes, actual_series, load_job_times
from twin.clock import window_start
from twin.domain import canonical_gpu_name
from twin.limits import series_intervals_problem
from twin.run_metrics import wait_quantiles
from twin.slo_attainment import Slo, SloSet, judge_intervals


def actual_slo_series(times: JobTimes, edges_s: Sequence[float] | np.ndarray) -> dict[str, np.ndarray]:
    """Per interval between `edges_s` (seconds from `times.origin`), every figure an SLO may bound."""
    edges = np.asarray(edges_s, dtype=float)
    series = actual_series(times, edges)
    # A job submitted before the window waited from its submission; one started before the window is none
    # of its waits (as a forecast's jobs running at its start): `wait_quantiles` counts starts within it. A
    # job whose end arrived without its start (telemetry lost on the way) waits no more once it ended.
    left = np.where(np.isnan(times.started), times.ended, times.started)
    p50, p95 = wait_quantiles(times.submitted, times.started, edges, times.rejected, left)
    finished = series["jobs_completed"] + series["jobs_failed"]
    failure_ratio = np.where(finished > 0, series["jobs_failed"] / np.maximum(finished, 1), np.nan)
    return series | {"wait_p50_s": p50, "wait_p95_s": p95, "runtime_failure_ratio": failure_ratio}


def _record_values(slo: Slo, series: dict[str, np.ndarray], intervals: int) -> np.ndarray:
    """The SLO's figure per interval (NaN where there is no data, or the GPU type has no node up)."""
    key = slo.metric if slo.gpu_model is None else BY_TYPE + canonical_gpu_name(slo.gpu_model)
    found = series.get(key)
    return np.full(intervals, np.nan) if found is None else np.asarray(found, dtype=float)


def attainment_as_it_happened(
    slos: SloSet,
    series: dict[str, np.ndarray],
    edges_s: Sequence[float] | np.ndarray,
    record_from_s: float | None = None,
) -> list[dict[str, Any]]:
    """Per SLO, on the record's `series` over the intervals between `edges_s` (`actual_slo_series`): its
    figure per interval (`values`), whether it held (`held`: None without data), and `attainment`, the
    share of the intervals with data in which it held (None when none has data). An interval over before
    `record_from_s` (when the telemetry began) has no data: an idle cluster then was no cluster on record,
    not one at 0 % utilization."""
    intervals = len(edges_s) - 1
    unrecorded = np.zeros(intervals, dtype=bool)
    if record_from_s is not None:
        unrecorded = np.asarray(edges_s, dtype=float)[1:] <= record_from_s
    out = []
    for slo in slos.slos:
        values = np.where(unrecorded, np.nan, _record_values(slo, series, intervals))
        held, attainment = judge_intervals(slo, values.tolist())
        judged = sum(1 for h in held if not math.isnan(h))
        out.append(
            {
                "name": slo.name,
                "metric": slo.metric,
                "max": slo.max,
                "min": slo.min,
                "gpu_model": slo.gpu_model,
                "attainment": None if math.isnan(attainment) else attainment,
                "judged": judged,
                "held": [None if math.isnan(h) else bool(h) for h in held],
                "values": [None if math.isnan(v) else float(v) for v in values],
            }
        )
    return out


# How far back the record is judged at most: a month of intervals (744 at the default hour).
MAX_WINDOW_S = 31 * 86400.0


def window_problem(window_s: float, interval_s: float) -> str | None:
    """Why the record cannot be judged over `window_s` in steps of `interval_s`, None when it can."""
    if not window_s > 0:  # NaN too
        return "not positive"
    if window_s > MAX_WINDOW_S:
        return f"longer than the 31 days ({MAX_WINDOW_S:,.0f} s) the record is judged over at most"
    return series_intervals_problem(window_s, interval_s)


def slos_as_they_happened(
    engine: Engine, cluster_id: str, slos: SloSet, now: datetime, window_s: float, interval_s: float
) -> dict[str, Any]:
    """The SLOs judged on the record of the `window_s` before `now` (whole intervals of `interval_s`), the
    hours before the telemetry began without data (`twin.clock.window_start`). Check `window_problem`
    first."""
    count = max(1, math.ceil(window_s / interval_s - 1e-9))
    since = now - timedelta(seconds=count * interval_s)
    times = load_job_times(engine, cluster_id, since, now)
    edges = np.arange(count + 1) * interval_s
    began = window_start(engine, cluster_id, since, now)
    return {
        "since": since,
        "until": now,
        "interval_s": interval_s,
        "slos": attainment_as_it_happened(
            slos, actual_slo_series(times, edges), edges, (began - since).total_seconds()
        ),
    }
