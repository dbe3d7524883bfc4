"""The twin's clock is the telemetry's: forecasts start at the newest event time when the two disagree, and
the arrival process is learned from the last window of telemetry time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from tests.twin.test_store import NOW, populate
from twin.clock import TELEMETRY, WALL, choose_now, twin_clock, window_start
from twin.db import session_scope
from twin.forecast import ForecastOptions, forecast
from twin.live_state import load_live_inputs
from twin.store import TelemetryEvent
from twin.uncalibrated import FallbackModels


def add_events(engine: Engine, times: list[datetime], cluster_id: str = "default") -> None:
    with session_scope(engine) as session:
        for ts in times:
            session.add(
                TelemetryEvent(event_id=str(uuid.uuid4()), type="job.progress", ts=ts, cluster_id=cluster_id,
                               job_id="x", payload={}, received_at=datetime.now(UTC))
            )  # fmt: skip


def test_the_wall_clock_serves_within_the_tolerance_and_the_telemetry_beyond_it() -> None:
    wall = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert choose_now(wall, None) == (wall, WALL)
    close = wall - timedelta(minutes=2)
    assert choose_now(wall, close, tolerance_s=300) == (wall, WALL)
    for far in (wall - timedelta(days=700), wall + timedelta(hours=40)):  # a dated replay; a fast one
        assert choose_now(wall, far, tolerance_s=300) == (far, TELEMETRY)


def test_the_clock_reads_the_newest_event_of_its_own_cluster(engine: Engine) -> None:
    assert twin_clock(engine).telemetry_latest is None
    add_events(engine, [NOW - timedelta(hours=5), NOW, NOW - timedelta(hours=1)])
    add_events(engine, [NOW + timedelta(days=3)], cluster_id="other")
    clock = twin_clock(engine, "default", wall=NOW + timedelta(days=400))
    assert clock.source == TELEMETRY and clock.now == NOW
    assert clock.telemetry_earliest == NOW - timedelta(hours=5)
    assert clock.lag_s == pytest.approx(400 * 86400.0)


def test_a_forecast_of_old_telemetry_starts_at_its_newest_event_and_sees_its_arrivals(engine: Engine) -> None:
    # The store's cluster lived two days up to NOW, long before the wall clock's today.
    populate(engine, NOW)
    add_events(engine, [NOW - timedelta(hours=48), NOW])
    inputs = load_live_inputs(engine, lookback=timedelta(days=7))
    assert inputs.start == NOW
    assert inputs.clock is not None and inputs.clock["source"] == TELEMETRY
    assert any("telemetry's newest time" in note for note in inputs.notes)
    # 52 submissions in the 48 hours the telemetry covers: 26 a day. A window of 7 days of wall time would
    # have diluted it to 7.4, and one ending at the wall clock would have seen none.
    assert inputs.arrivals is not None and inputs.arrivals.daily_jobs == pytest.approx(26.0)
    assert sorted(inputs.workload.job_ids) == ["queued-1", "running-1"]
    document = forecast(inputs, FallbackModels(), ForecastOptions(horizon_s=6 * 3600.0, runs=2, workers=1))
    assert document["start"] == NOW.isoformat() and document["arrivals_per_day"] == pytest.approx(26.0)
    assert document["clock"]["source"] == TELEMETRY
    assert document["known_jobs"]["total"] == 2


def test_the_standing_forecast_follows_telemetry_time(engine: Engine, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A tick makes a forecast when FINETWIN_FORECAST_EVERY of telemetry time has passed since the last
    one started, and not before, however much wall time passed."""
    from fastapi.testclient import TestClient

    from advisor.app import create_app
    from finetwin.settings import Settings
    from tests.conftest import api_parts
    from twin.forecast_store import latest_forecast

    monkeypatch.setenv("FINETWIN_FORECAST_EVERY", "30m")
    settings = Settings(data_dir=tmp_path / "d", models_dir=tmp_path / "m", scheduler_enabled=False,
                        forecast_runs=2, forecast_horizon_hours=2)  # fmt: skip
    assert settings.forecast_every == 1800.0
    populate(engine, NOW)
    add_events(engine, [NOW - timedelta(hours=48), NOW])
    parts = api_parts(settings, engine)
    with TestClient(create_app(parts)):
        job = parts.scheduler.get_job("standing-forecast")
        job.func(*job.args)
        first = latest_forecast(engine, cluster_id="default")
        assert first is not None and first.start is not None and first.document["start"] == NOW.isoformat()
        add_events(engine, [NOW + timedelta(minutes=20)])  # 20 min of telemetry time: not due
        job.func(*job.args)
        assert latest_forecast(engine, cluster_id="default").id == first.id
        add_events(engine, [NOW + timedelta(minutes=31)])  # due
        job.func(*job.args)
        second = latest_forecast(engine, cluster_id="default")
        assert second.id != first.id and second.document["start"] == (NOW + timedelta(minutes=31)).isoformat()


def test_one_stray_event_years_back_does_not_spread_the_arrivals_over_the_window(engine: Engine) -> None:
    """A node's report dated nine years back (a clock that was off) counted as telemetry all along: the 52
    submissions of two days were spread over seven, 7.4 a day. The telemetry began again where its newest
    event before the window is older than the window is long."""
    populate(engine, NOW)
    add_events(engine, [NOW - timedelta(days=9 * 365), NOW - timedelta(hours=48), NOW])
    inputs = load_live_inputs(engine, lookback=timedelta(days=7))
    assert inputs.arrivals is not None and inputs.arrivals.daily_jobs == pytest.approx(26.0)


def test_a_quiet_spell_shorter_than_the_window_is_history(engine: Engine) -> None:
    """Telemetry that ran before the window, then went quiet for five days (less than the window): the
    window keeps its seven days, and the 52 submissions are 52 in seven days."""
    populate(engine, NOW)
    add_events(engine, [NOW - timedelta(days=8), NOW - timedelta(hours=48), NOW])
    start = NOW - timedelta(days=7)
    assert window_start(engine, "default", start, NOW) == start
    inputs = load_live_inputs(engine, lookback=timedelta(days=7))
    assert inputs.arrivals is not None and inputs.arrivals.daily_jobs == pytest.approx(52 / 7)


def test_one_event_from_a_clock_running_ahead_does_not_move_the_twins_clock(engine: Engine) -> None:
    """A live cluster at the wall clock, and one event dated 50 minutes ahead (ingest accepts up to an hour):
    it moved the twin's clock 50 minutes ahead, and the intervals in between were scored against nothing.
    A replay's timeline ahead of the wall clock has many events there, and the twin follows it."""
    wall = NOW
    add_events(engine, [wall - timedelta(minutes=m) for m in (30, 12, 2)])
    add_events(engine, [wall + timedelta(minutes=50)])
    clock = twin_clock(engine, wall=wall)
    assert (clock.source, clock.now, clock.telemetry_latest) == (WALL, wall, wall - timedelta(minutes=2))
    add_events(engine, [wall + timedelta(minutes=m) for m in (20, 40)])  # now three events are ahead
    clock = twin_clock(engine, wall=wall)
    assert (clock.source, clock.now) == (TELEMETRY, wall + timedelta(minutes=50))


def test_a_store_whose_only_events_are_ahead_waits_for_them_to_be_corroborated(engine: Engine) -> None:
    add_events(engine, [NOW + timedelta(minutes=50)])
    clock = twin_clock(engine, wall=NOW)
    assert (clock.source, clock.now, clock.telemetry_latest) == (WALL, NOW, None)
