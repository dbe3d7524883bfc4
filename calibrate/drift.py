"""The live error of the model in use, rolled over its last finished jobs, and when it has drifted.

Read from the `live_errors` table, so it is the same number wherever it is computed: in the ingest worker
right after a batch (which can trigger a refit at once) or in the API (the dashboard, the periodic check).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Connection, select

from calibrate.records import LiveError
from calibrate.settings import CalibrateSettings


@dataclass(frozen=True)
class DriftPolicy:
    window: int = 50
    min_jobs: int = 20
    mdape_threshold: float = 0.25
    failure_error_threshold: float = 0.15

    @classmethod
    def from_settings(cls, settings: CalibrateSettings) -> DriftPolicy:
        return cls(
            window=settings.drift_window,
            min_jobs=settings.drift_min_jobs,
            mdape_threshold=settings.drift_mdape_threshold,
            failure_error_threshold=settings.drift_failure_error_threshold,
        )


@dataclass(frozen=True)
class LiveErrorSummary:
    """The rolling live error of one model version over its last `jobs` finished jobs."""

    model_version: str
    jobs: int  # finished jobs in the window (any outcome)
    throughput_jobs: int  # of them, completed runs with a measured throughput
    mdape: float | None  # median APE of the p50, None without completed runs
    band_coverage: float | None
    failure_error: float | None  # share of jobs whose outcome was predicted wrongly
    last_ended_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DriftReport:
    summary: LiveErrorSummary
    reasons: list[str]

    def __str__(self) -> str:
        return f"live error of {self.summary.model_version} drifted: {'; '.join(self.reasons)}"


def summarize(connection: Connection, model_version: str, window: int) -> LiveErrorSummary:
    query = (
        select(LiveError.ape, LiveError.in_band, LiveError.outcome_error, LiveError.ended_at)
        .where(LiveError.model_version == model_version)
        .order_by(LiveError.id.desc())  # type: ignore[union-attr]
        .limit(window)
    )
    rows = connection.execute(query).all()
    apes = np.array([r.ape for r in rows if r.ape is not None], dtype=float)
    bands = [bool(r.in_band) for r in rows if r.in_band is not None]
    errors = np.array([r.outcome_error for r in rows], dtype=float)
    return LiveErrorSummary(
        model_version=model_version,
        jobs=len(rows),
        throughput_jobs=int(apes.size),
        mdape=float(np.median(apes)) if apes.size else None,
        band_coverage=float(np.mean(bands)) if bands else None,
        failure_error=float(errors.mean()) if errors.size else None,
        last_ended_at=max((r.ended_at for r in rows), default=None),
    )


def drift(summary: LiveErrorSummary, policy: DriftPolicy) -> DriftReport | None:
    """A report when the rolling error is past a threshold on enough jobs, else None."""
    reasons = []
    enough_runs = summary.throughput_jobs >= policy.min_jobs
    if enough_runs and summary.mdape is not None and summary.mdape > policy.mdape_threshold:
        reasons.append(
            f"throughput MdAPE {summary.mdape:.1%} over the last {summary.throughput_jobs} completed jobs "
            f"> {policy.mdape_threshold:.1%}"
        )
    enough_jobs = summary.jobs >= policy.min_jobs
    error = summary.failure_error
    if enough_jobs and error is not None and error > policy.failure_error_threshold:
        reasons.append(
            f"outcome error {error:.1%} over the last {summary.jobs} finished jobs "
            f"> {policy.failure_error_threshold:.1%}"
        )
    return DriftReport(summary, reasons) if reasons else None


@dataclass(frozen=True)
class LiveErrorPoint:
    """One finished job and the rolling live error up to it (the dashboard's chart)."""

    job_id: str
    ended_at: datetime
    model_version: str
    predicted_outcome: str
    actual_outcome: str
    ape: float | None
    rolling_jobs: int
    rolling_mdape: float | None
    rolling_failure_error: float | None


def live_error_series(
    connection: Connection, *, window: int, limit: int, model_version: str | None = None
) -> list[LiveErrorPoint]:
    """The last `limit` finished jobs (oldest first), each with the live error rolled over the `window`
    jobs that end with it (of the same version when one is asked for, else of any)."""
    query = select(
        LiveError.job_id, LiveError.ended_at, LiveError.model_version, LiveError.predicted_outcome,
        LiveError.actual_outcome, LiveError.ape, LiveError.outcome_error,
    ).order_by(LiveError.id.desc()).limit(limit + window - 1)  # type: ignore[union-attr]  # fmt: skip
    if model_version is not None:
        query = query.where(LiveError.model_version == model_version)
    rows = list(reversed(connection.execute(query).all()))
    points = []
    for end in range(max(0, len(rows) - limit), len(rows)):
        recent = rows[max(0, end - window + 1) : end + 1]
        apes = [r.ape for r in recent if r.ape is not None]
        row = rows[end]
        points.append(
            LiveErrorPoint(
                job_id=row.job_id,
                ended_at=row.ended_at,
                model_version=row.model_version,
                predicted_outcome=row.predicted_outcome,
                actual_outcome=row.actual_outcome,
                ape=row.ape,
                rolling_jobs=len(recent),
                rolling_mdape=float(np.median(apes)) if apes else None,
                rolling_failure_error=float(np.mean([r.outcome_error for r in recent])),
            )
        )
    return points
