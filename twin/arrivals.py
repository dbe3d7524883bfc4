"""Future arrivals, drawn from the observed arrival process.

The rate is piecewise constant by hour of day (UTC), estimated from the submissions seen over a lookback
window (hours the window never covered take the overall mean rate). Each arrival's job is resampled, with
replacement, from the observed submissions (its configuration, GPUs and work), so the forecast's job mix is
the cluster's own.

A rate estimated from a window is uncertain, the more so the fewer submissions it saw: two hours of
telemetry hold a few dozen, and an hour of the day seen on seven days holds seven hours' worth. Each run of
an ensemble draws its own rates from what the window allows (`ArrivalModel.run_rates`): the overall rate
from its Gamma posterior, and each hour's from a Gamma posterior that pools it toward the overall rate as
much as the hours' own spread says they differ (empirical Bayes, `pooling_hours`). With the rate taken as
known, only the arrivals' Poisson noise spread the runs: a forecast made from a thin window was as sure of
its arrivals as one made from a week.
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
    hourly_rate: np.ndarray  # (24,) jobs per hour, by UTC hour of day: the window's estimate
    mix: Workload  # observed submissions to resample (arrival times ignored)
    start_hour: float = 0.0  # hour of day (UTC, fractional) at simulation time 0
    # The evidence behind the rate, by hour of day: submissions counted, hours of it the window covered, and
    # how strongly an hour's rate is pooled toward the overall one (hours). None: the rate is known exactly
    # (a model made by hand, a scenario's rate).
    counts: np.ndarray | None = None
    covered: np.ndarray | None = None
    pooling: float = 0.0

    @property
    def daily_jobs(self) -> float:
        return float(self.hourly_rate.sum())

    def run_rates(self, rng: np.random.Generator) -> np.ndarray:
        """One run's hourly rates: drawn from the posterior the window's evidence gives (the overall rate
        from Gamma(n, 1/h), each hour's from Gamma(count + k x overall, 1 / (covered + k))), or the rate as
        given when the model holds no evidence."""
        if self.counts is None or self.covered is None:
            return self.hourly_rate
        seen, hours = float(self.counts.sum()), float(self.covered.sum())
        if seen <= 0 or hours <= 0:
            return self.hourly_rate
        overall = rng.gamma(seen, 1.0 / hours)
        return rng.gamma(self.counts + self.pooling * overall, 1.0 / (self.covered + self.pooling))

    def sample(self, rng: np.random.Generator, horizon_s: float, prefix: str = "arrival") -> Workload:
        """Arrivals in (0, horizon_s], as a workload with ids `prefix-0`, `prefix-1`, ... in time order, at
        this run's rates (`run_rates`)."""
        if len(self.mix) == 0 or horizon_s <= 0 or not self.hourly_rate.any():
            return Workload.empty(self.mix.catalog)
        hourly_rate = self.run_rates(rng)
        times: list[np.ndarray] = []
        t = 0.0
        hour = self.start_hour
        while t < horizon_s:
            step = min((np.floor(hour) + 1 - hour) * 3600.0, horizon_s - t)
            rate = hourly_rate[int(np.floor(hour)) % HOURS] / 3600.0
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
    return ArrivalModel(
        hourly_rate=rate, mix=mix, start_hour=start_hour, counts=counts, covered=covered,
        pooling=pooling_hours(counts, covered),
    )  # fmt: skip


def pooling_hours(counts: np.ndarray, covered: np.ndarray) -> float:
    """How many hours of the overall rate an hour of the day's rate is pooled with: the mean over the
    variance of the hours' true rates, that variance estimated as the spread of their observed rates less
    what Poisson noise alone gives them (method of moments). The hours then keep the differences the window
    shows beyond its noise. With no such difference, or fewer than three hours of the day seen to tell, all
    of the window's hours: the hours share the overall rate, whose own uncertainty remains."""
    seen = covered > 0
    hours = float(covered.sum())
    if seen.sum() < 3 or counts.sum() <= 0:
        return hours
    overall = counts.sum() / hours
    observed = counts[seen] / covered[seen]
    between = float(np.mean((observed - overall) ** 2 - overall / covered[seen]))
    return hours if between <= 0 else min(hours, overall / between)
