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
