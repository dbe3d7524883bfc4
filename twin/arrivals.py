"""Future arrivals, drawn from the observed arrival process.

The rate is piecewise constant by hour of day (UTC), estimated from the submissions seen over a lookback
window (hours the window never covered take the overall mean rate). Each arrival's job is resampled, with
replacement, from the observed submissions (its configuration, GPUs and work), so the forecast's job mix is
the cluster's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from twin.workload import Workload

HOURS = 24


@dataclass(frozen=True)
class ArrivalModel:
    hourly_rate: np.ndarray  # (24,) jobs per hour, by UTC hour of day
    mix: Workload  # observed submissions to resample (arrival times ignored)
    start_hour: float = 0.0  # hour of day (UTC, fractional) at simulation time 0

    @property
    def daily_jobs(self) -> float:
        return float(self.hourly_rate.sum())

    def sample(self, rng: np.random.Generator, horizon_s: float, prefix: str = "arrival") -> Workload:
        """Arrivals in (0, horizon_s], as a workload with ids `prefix-0`, `prefix-1`, ... in time order."""
        if len(self.mix) == 0 or horizon_s <= 0 or not self.hourly_rate.any():
            return Workload.empty(self.mix.catalog)
        times: list[np.ndarray] = []
        t = 0.0
        hour = self.start_hour
        while t < horizon_s:
            step = min((np.floor(hour) + 1 - hour) * 3600.0, horizon_s - t)
            rate = self.hourly_rate[int(np.floor(hour)) % HOURS] / 3600.0
            count = rng.poisson(rate * step)
            if count:
                times.append(np.sort(t + rng.uniform(0.0, step, count)))
            t += step
            hour += step / 3600.0
        if not times:
            return Workload.empty(self.mix.catalog)
        arrival = np.concatenate(times)
        rows = rng.integers(0, len(self.mix), size=len(arrival))
        mix = self.mix
        return Workload(
            job_ids=[f"{prefix}-{k}" for k in range(len(arrival))],
            arrival_s=np.maximum(arrival, np.nextafter(0.0, 1.0)),
            gpus=mix.gpus[rows].copy(),
            gpu_models=[mix.gpu_models[r] for r in rows],
            duration_s=mix.duration_s[rows].copy(),
            work_tokens=mix.work_tokens[rows].copy(),
            config_idx=mix.config_idx[rows].copy(),
            catalog=mix.catalog,
        )


def fit_arrivals(
    submitted_at: Sequence[datetime], mix: Workload, now: datetime, lookback: timedelta
) -> ArrivalModel:
    """The hour-of-day rate from submissions in [now - lookback, now)."""
    start = now - lookback
    counts = np.zeros(HOURS)
    for ts in submitted_at:
        if start <= ts < now:
            counts[ts.hour] += 1
    # How many hours of each hour-of-day the window covered (fractions at its two ends).
    covered = np.zeros(HOURS)
    cursor = start
    while cursor < now:
        top = min(cursor.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1), now)
        covered[cursor.hour] += (top - cursor).total_seconds() / 3600.0
        cursor = top
    seen = covered > 0
    rate = np.zeros(HOURS)
    rate[seen] = counts[seen] / covered[seen]
    if seen.any() and not seen.all():
        rate[~seen] = counts.sum() / covered.sum()
    start_hour = now.hour + now.minute / 60.0 + now.second / 3600.0
    return ArrivalModel(hourly_rate=rate, mix=mix, start_hour=start_hour)
