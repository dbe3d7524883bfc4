"""Stopping the API while its scheduler is in the middle of a standing forecast: the forecast stops after the
ensemble runs in flight and is waited for, so the process exits instead of hanging on a pool that meets
the interpreter's exit (what made `finetwin up` ignore Ctrl-C)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor.parts import ShuttingDown
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.conftest import api_parts
from tests.twin.test_clock import add_events
from tests.twin.test_store import NOW, populate
from twin.limits import MAX_ENSEMBLE_RUNS

# The most runs a forecast takes, far more than the test lets run: a forecast that is not stopped would take
# a minute, where a stopped one ends after its first run or two.
RUNS = MAX_ENSEMBLE_RUNS


def test_stopping_the_app_abandons_a_running_standing_forecast_and_waits_for_it(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calibrated_models_dir: Path
) -> None:
    from advisor.app import create_app
    from advisor.routers import forecast as forecast_router
    from finetwin.settings import Settings
    from twin.forecast_store import latest_forecast

    # A version in use, so the scheduler has no first model to fit (the shutdown would wait for that fit).
    settings = Settings(data_dir=tmp_path / "d", models_dir=calibrated_models_dir, scheduler_enabled=True,
                        forecast_runs=RUNS, forecast_workers=1, forecast_horizon_hours=24)  # fmt: skip
    populate(engine, NOW)
    add_events(engine, [NOW])
    running, finished = threading.Event(), threading.Event()
    runs: list[int] = []
    raised: list[BaseException] = []
    real_forecast = forecast_router.forecast

    def observed_forecast(*args: Any, progress: Any = None, **kwargs: Any) -> Any:
        def each_run() -> None:
            runs.append(1)
            running.set()
            progress()  # the standing forecast's own callback: raises once the app is stopping

        try:
            return real_forecast(*args, progress=each_run, **kwargs)
        except BaseException as exc:
            raised.append(exc)
            raise
        finally:
            finished.set()

    monkeypatch.setattr(forecast_router, "forecast", observed_forecast)
    parts = api_parts(settings, engine)
    with TestClient(create_app(parts)):
        assert running.wait(120), "the scheduler's first tick (due at once) never ran a forecast"
    # Leaving the client ran the app's shutdown: it waited for the forecast, which had stopped early.
    assert finished.is_set() and not parts.scheduler.running
    assert len(raised) == 1 and isinstance(raised[0], ShuttingDown)
    assert 0 < len(runs) < RUNS
    assert latest_forecast(engine, cluster_id=settings.cluster_id) is None  # nothing half-made stored


def test_steering_stops_between_runs_when_its_progress_callback_raises(
    engine: Engine, tmp_path: Path
) -> None:
    from advisor.steering import run_steering
    from finetwin.settings import Settings

    populate(engine, NOW)
    add_events(engine, [NOW])
    slo_file = tmp_path / "slos.yaml"
    slo_file.write_text("slos:\n  - {name: wait, metric: wait_p95_s, max: 600}\n")
    settings = Settings(data_dir=tmp_path / "d", models_dir=tmp_path / "m", slo_file=slo_file,
                        steering_replications=50, forecast_workers=1)  # fmt: skip
    calls: list[int] = []

    def stop_after_three() -> None:
        calls.append(1)
        if len(calls) >= 3:
            raise ShuttingDown("stop")

    models = FakeInUse(FakeModels())
    with pytest.raises(ShuttingDown):
        run_steering(engine, settings, models, actor="test", source="test", progress=stop_after_three)
    assert len(calls) == 3  # not the baseline's 50 runs, nor the candidates'
