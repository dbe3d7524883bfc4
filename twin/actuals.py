"""What the store recorded, per interval: the same figures a forecast's series holds, measured from the jobs'
telemetry (submitted, started, ended) so that a forecast can be scored against them.

Per interval [a, b): utilization (GPU-seconds held / GPU-seconds up, overall and per GPU type; the GPUs up
at each time by the nodes' reports, `twin.gpus_up`; no data where none was up), mean queue
length and mean running jobs (time-averaged, like the forecast's), jobs completed and failed (by end time),
energy (GPU-seconds at the job's measured power per GPU; a job that never reported power draws what the
twin assumes for it, 75 % of its GPUs' board power). Rejected jobs never queue (the twin rejects them on
arrival). Times are seconds from an origin; a job still queued or running is open-ended.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import Engine, or_
from sqlmodel import Session, col, select

from twin.clock import as_utc
from twin.db import in_chunks
from twin.domain import canonical_gpu_name
from twin.gpus_up import GpusUp, load_gpus_up
from twin.plan import recorded_power_w
from twin.run_metrics import integrate_on_bins
from twin.store import JOB_ROWS, Job, ObservedRun, job_records
from twin.units import JOULES_PER_KWH

OVERALL_FIGURES = (
    "utilization",
    "queue_length",
    "running_jobs",
    "jobs_completed",
    "jobs_failed",
    "energy_kwh",
)
BY_TYPE = "utilization/"  # figure name prefix of the utilization of one GPU type


@dataclass
class JobTimes:
    """The jobs of a window, as columns of seconds from `origin` (NaN = not yet / never)."""

    origin: datetime
    submitted: np.ndarray
    started: np.ndarray
    ended: np.ndarray
    gpus: np.ndarray
    gpu_models: list[str]
    power_w: np.ndarray  # per GPU
    completed: np.ndarray  # bool
    failed: np.ndarray  # bool
    rejected: np.ndarray  # bool
    gpus_up: GpusUp  # the cluster's GPUs up over time, by type


def _seconds(ts: datetime | None, origin: datetime) -> float:
    return float("nan") if ts is None else (as_utc(ts) - origin).total_seconds()


def load_job_times(engine: Engine, cluster_id: str, since: datetime, until: datetime) -> JobTimes:
    """Every job of the cluster that was queued or running at some time in [since, until)."""
    since, until = as_utc(since), as_utc(until)
    with Session(engine) as session:
        jobs = job_records(session, JOB_ROWS.where(
            Job.cluster_id == cluster_id,
            col(Job.submitted_at).is_not(None) | col(Job.started_at).is_not(None),
            or_(col(Job.submitted_at) < until, col(Job.started_at) < until),
            or_(col(Job.ended_at).is_(None), col(Job.ended_at) >= since),
        ))  # fmt: skip
        ids = [j.job_id for j in jobs]
        measured: dict[str, float] = {}
        for chunk in in_chunks(ids):
            for job_id, watts in session.exec(
                select(ObservedRun.job_id, ObservedRun.gpu_power_watts_avg).where(
                    col(ObservedRun.job_id).in_(chunk), col(ObservedRun.gpu_power_watts_avg).is_not(None)
                )
            ):
                measured[job_id] = float(watts)
        gpus_up = load_gpus_up(session, cluster_id, since, until)
    gpu_models = [canonical_gpu_name(j.gpu_model) if j.gpu_model else "" for j in jobs]

    return JobTimes(
        origin=since,
        submitted=np.array([_seconds(j.submitted_at, since) for j in jobs], dtype=float),
        started=np.array([_seconds(j.started_at, since) for j in jobs], dtype=float),
        ended=np.array([_seconds(j.ended_at, since) for j in jobs], dtype=float),
        gpus=np.array([j.number_gpus or 0 for j in jobs], dtype=float),
        gpu_models=gpu_models,
        power_w=np.array(
            [
                recorded_power_w(measured.get(j.job_id), j.last_power_watts, g)
                for j, g in zip(jobs, gpu_models, strict=True)
            ],
            dtype=float,
        ),
        completed=np.array([j.state == "completed" for j in jobs], dtype=bool),
        failed=np.array([j.state == "failed" for j in jobs], dtype=bool),
        rejected=np.array([j.state == "rejected" for j in jobs], dtype=bool),
        gpus_up=gpus_up,
    )


def actual_series(times: JobTimes, edges_s: Sequence[float] | np.ndarray) -> dict[str, np.ndarray]:
    """Per interval between `edges_s` (seconds from `times.origin`), the figures of OVERALL_FIGURES and
    `utilization/<GPU type>` for each type the cluster has."""
    edges = np.asarray(edges_s, dtype=float)
    width = np.diff(edges)
    safe = np.where(width > 0, width, 1.0)
    end_of_window = edges[-1]
    started = ~np.isnan(times.started)
    run_from = np.where(started, times.started, 0.0)
    run_to = np.where(started, np.where(np.isnan(times.ended), end_of_window, times.ended), 0.0)
    # Queued from submission (or from the start of the record for a job whose submission came late) until
    # it started, or ended without starting; a rejected job never queues.
    submitted = np.where(np.isnan(times.submitted), run_from, times.submitted)
    left = np.where(started, times.started, np.where(np.isnan(times.ended), end_of_window, times.ended))
    queue_to = np.where(times.rejected, submitted, np.maximum(left, submitted))
    queued = integrate_on_bins(submitted, np.minimum(queue_to, end_of_window), np.ones(len(submitted)), edges)
    running = integrate_on_bins(run_from, run_to, np.ones(len(run_from)), edges)
    busy = integrate_on_bins(run_from, run_to, times.gpus, edges)
    energy_j = integrate_on_bins(run_from, run_to, times.gpus * times.power_w, edges)
    up = times.gpus_up.seconds_up(edges)
    out = {
        "utilization": _share(busy, sum(up.values(), np.zeros(len(width)))),
        "queue_length": queued / safe,
        "running_jobs": running / safe,
        "jobs_completed": _count(times.ended[times.completed], edges),
        "jobs_failed": _count(times.ended[times.failed], edges),
        "energy_kwh": energy_j / JOULES_PER_KWH,
    }
    models = np.asarray(times.gpu_models, dtype=object)
    for name, seconds_up in up.items():
        mask = models == name
        out[BY_TYPE + name] = _share(
            integrate_on_bins(run_from[mask], run_to[mask], times.gpus[mask], edges), seconds_up
        )
    return out


def _share(held: np.ndarray, up: np.ndarray) -> np.ndarray:
    """GPU-seconds held over GPU-seconds up, per interval; NaN (no data) where no GPU was up."""
    return np.where(up > 0, held / np.where(up > 0, up, 1.0), np.nan)


def _count(at: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Events per interval [a, b) (the last interval closed on the right, as `np.histogram` does)."""
    at = at[~np.isnan(at)]
    if edges[-1] <= edges[0]:
        return np.zeros(len(edges) - 1)
    counts, _ = np.histogram(at, bins=edges)
    return counts.astype(float)
