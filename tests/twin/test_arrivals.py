"""The observed arrival process: rate by hour of day, and arrivals drawn from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from twin.arrivals import ArrivalModel, fit_arrivals
from twin.workload import Workload

NOW = datetime(2026, 11, 30, 6, 30, tzinfo=UTC)


def test_rate_by_hour_of_day_from_a_week_of_submissions() -> None:
    # A week: 10 jobs in every 09:00 hour, 1 in every other hour.
    submitted = []
    start = NOW - timedelta(days=7)
    t = start.replace(minute=0)
    while t < NOW:
        submitted += [t + timedelta(minutes=5 * k) for k in range(10 if t.hour == 9 else 1) if t >= start]
        t += timedelta(hours=1)
    mix = Workload.from_durations(np.zeros(3), [60.0, 120.0, 180.0])
    model = fit_arrivals(submitted, mix, NOW, timedelta(days=7))
    assert model.hourly_rate[9] == pytest.approx(10.0)
    assert model.hourly_rate[3] == pytest.approx(1.0)
    assert model.start_hour == pytest.approx(6.5)


def test_hours_never_observed_take_the_mean_rate() -> None:
    submitted = [NOW - timedelta(minutes=m) for m in range(5, 120, 10)]  # 12 in the last two hours
    model = fit_arrivals(submitted, Workload.from_durations([0.0], [1.0]), NOW, timedelta(hours=2))
    assert model.hourly_rate[5] == pytest.approx(6.0) and model.hourly_rate[20] == pytest.approx(6.0)


def test_sampled_arrivals_follow_the_rates_and_resample_the_mix() -> None:
    rates = np.zeros(24)
    rates[10] = 600.0  # jobs only between 10:00 and 11:00
    mix = Workload.from_durations(np.zeros(3), [60.0, 120.0, 180.0], gpus=[1, 2, 4])
    model = ArrivalModel(hourly_rate=rates, mix=mix, start_hour=9.5)
    sample = model.sample(np.random.default_rng(1), 86400.0)
    assert len(sample) == pytest.approx(600, abs=80)
    assert sample.arrival_s.min() >= 1800.0 and sample.arrival_s.max() <= 5400.0
    assert (np.diff(sample.arrival_s) >= 0).all()
    assert set(sample.duration_s.tolist()) == {60.0, 120.0, 180.0}
    assert sample.job_ids[:2] == ["arrival-0", "arrival-1"]
    again = model.sample(np.random.default_rng(1), 86400.0)
    np.testing.assert_array_equal(again.arrival_s, sample.arrival_s)


def _evenly(per_hour: int, hours: int) -> list[datetime]:
    """`per_hour` submissions in each of the `hours` before NOW, evenly inside each hour."""
    return [
        NOW - timedelta(hours=h) + timedelta(minutes=60 * (k + 0.5) / per_hour)
        for h in range(1, hours + 1)
        for k in range(per_hour)
    ]


def _arrivals_per_run(model: ArrivalModel, runs: int, horizon_s: float = 86400.0) -> np.ndarray:
    return np.array([len(model.sample(np.random.default_rng(seed), horizon_s)) for seed in range(runs)])


def test_a_rate_from_a_thin_window_spreads_the_runs_as_far_as_its_evidence_allows() -> None:
    """A day of 3 submissions an hour, no hour unlike another: the hours pool fully (k = 24 hours), the
    overall rate is drawn from Gamma(72, 1/24). The number of arrivals in the next day then has variance
    72 (Poisson) + (24 x 24/25)^2 Var(overall) + 24 (3 + 24 x 3) / 625 = 72 + 66.4 + 2.9 = 141.3: twice what
    a rate taken as known gives."""
    mix = Workload.from_durations([0.0], [60.0])
    model = fit_arrivals(_evenly(3, 24), mix, NOW, timedelta(hours=24))
    assert model.pooling == pytest.approx(24.0)
    counts = _arrivals_per_run(model, 4000)
    assert counts.mean() == pytest.approx(72.0, rel=0.02)
    assert counts.var() == pytest.approx(141.3, rel=0.08)
    known = ArrivalModel(hourly_rate=model.hourly_rate, mix=mix, start_hour=model.start_hour)
    assert _arrivals_per_run(known, 4000).var() == pytest.approx(72.0, rel=0.08)


def test_the_more_the_window_saw_the_closer_the_runs_to_poisson_noise_alone() -> None:
    mix = Workload.from_durations([0.0], [60.0])
    thin = fit_arrivals(_evenly(3, 2), mix, NOW, timedelta(hours=2))
    thick = fit_arrivals(_evenly(3, 24 * 28), mix, NOW, timedelta(days=28))
    assert (thin.counts.sum(), thin.covered.sum()) == (6, pytest.approx(2.0))  # type: ignore[union-attr]
    np.testing.assert_allclose(thick.hourly_rate, 3.0)
    thin_var, thick_var = _arrivals_per_run(thin, 2000).var(), _arrivals_per_run(thick, 2000).var()
    assert thin_var > 10 * 72.0  # 6 hours' evidence for a day: the rate itself is uncertain by ~40 %
    assert thick_var == pytest.approx(72.0 + 72.0**2 / (3 * 24 * 28), rel=0.1)


def test_hours_that_differ_beyond_their_noise_keep_their_own_rates() -> None:
    # A week: 10 jobs in every 09:00 hour, 1 in every other hour.
    hours = [NOW.replace(minute=0) - timedelta(hours=h) for h in range(24 * 7)]
    submitted = [t + timedelta(minutes=5 * k) for t in hours for k in range(10 if t.hour == 9 else 1)]
    model = fit_arrivals(submitted, Workload.from_durations([0.0], [60.0]), NOW, timedelta(days=7))
    assert model.hourly_rate[9] == pytest.approx(10.0) and model.hourly_rate[3] == pytest.approx(1.0)
    assert model.pooling < 2.0  # hours of the overall rate: each hour's week (7 hours) outweighs it
    drawn = np.mean([model.run_rates(np.random.default_rng(seed)) for seed in range(4000)], axis=0)
    overall, k = 231 / 168, model.pooling  # 23 hours x 7 + 70 submissions over 168 hours
    assert drawn[9] == pytest.approx((70 + k * overall) / (7 + k), rel=0.02)  # 9.5: 5 % toward the rest
    assert drawn[3] == pytest.approx((7 + k * overall) / (7 + k), rel=0.05)
    assert drawn.sum() == pytest.approx(33.0, rel=0.02)  # the day's total as the window saw it
