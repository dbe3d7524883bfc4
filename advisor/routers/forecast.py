"""Forecasts and what-ifs over HTTP.

`GET /v1/forecast` returns the latest standing forecast (or computes one when there is none, or it is
stale, or `refresh=true`); `POST /v1/whatif` compares a scenario with the baseline on paired seeds.
`startup` puts the standing forecast's refresh on the app's scheduler (every
`FINETWIN_FORECAST_REFRESH_MINUTES`), which stores each one.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request
from pydantic import Field

from advisor.auth import Role, access
from advisor.slos_in_force import current_slos
from calibrate.registry import InUseModels, RegistryError
from twin.cluster import ClusterFormatError
from twin.config_changes import Admission
from twin.forecast import ForecastOptions, forecast
from twin.forecast_store import STANDING, latest_forecast, save_forecast
from twin.live_state import NoClusterError, load_live_inputs
from twin.plan import PlanOptions
from twin.policies import Policy
from twin.protocols import JobModels
from twin.settings import Settings
from twin.slo_attainment import SloFormatError
from twin.uncalibrated import FallbackModels
from twin.whatif import WhatIf, run_whatif

log = logging.getLogger("finetwin.forecast")
router = APIRouter(tags=["forecast"])

NO_STATE = 409  # nothing to forecast yet (no node up) or the models fail verification: the caller can act
MAX_API_RUNS = 64  # a what-if over HTTP is bounded: two ensembles of at most this many runs


class WhatIfRequest(WhatIf):
    """A scenario: `changes` against a baseline of the live state (paired seeds)."""

    runs: int = Field(default=16, ge=1, le=MAX_API_RUNS)


def _job_models(app: FastAPI) -> tuple[JobModels | None, str]:
    cache = getattr(app.state, "models_in_use", None)
    if cache is None:  # shared with the models router: one registry cache per app
        cache = InUseModels(app.state.settings.resolved_models_dir())
        app.state.models_in_use = cache
    try:
        loaded = cache.get()
    except RegistryError as exc:
        raise HTTPException(NO_STATE, f"the models in use fail verification: {exc}") from None
    if loaded is None:
        return FallbackModels(), "fallback"
    version, models = loaded
    return models, f"calibrated {version}"


def _options(settings: Settings) -> ForecastOptions:
    return ForecastOptions(
        horizon_s=settings.forecast_horizon_hours * 3600.0,
        interval_s=settings.forecast_interval_minutes * 60.0,
        runs=settings.forecast_runs,
        seed=settings.forecast_seed,
        policy=Policy(settings.forecast_policy),
        plan=PlanOptions(admission=Admission(settings.forecast_admission)),
        workers=settings.forecast_workers,
    )


def _slos(app: FastAPI) -> Any:
    """The SLOs in force: the last set declared with PUT /v1/slos, else the file, else the defaults."""
    try:
        return current_slos(app.state.engine, app.state.settings).slos
    except SloFormatError as exc:
        raise HTTPException(NO_STATE, str(exc)) from None


def _live(app: FastAPI) -> Any:
    settings: Settings = app.state.settings
    try:
        return load_live_inputs(
            app.state.engine,
            cluster_id=settings.cluster_id,
            lookback=timedelta(days=settings.forecast_lookback_days),
        )
    except NoClusterError as exc:
        raise HTTPException(NO_STATE, str(exc)) from None


def compute_standing_forecast(app: FastAPI) -> dict[str, Any]:
    """A forecast from the live state with the cluster's settings, stored as the standing one."""
    settings: Settings = app.state.settings
    models, source = _job_models(app)
    document = forecast(_live(app), models, _options(settings), _slos(app), model_source=source)
    document["id"] = save_forecast(app.state.engine, document, cluster_id=settings.cluster_id, kind=STANDING)
    return document


def _refresh(app: FastAPI) -> None:
    lock: threading.Lock = app.state.forecast_lock
    if not lock.acquire(blocking=False):
        return  # the previous refresh is still running: skip this one rather than pile up
    try:
        compute_standing_forecast(app)
    except HTTPException as exc:
        log.info("standing forecast not refreshed: %s", exc.detail)
    except Exception:  # the scheduler must keep running; the next refresh tries again
        log.exception("standing forecast refresh failed")
    finally:
        lock.release()


def startup(app: FastAPI) -> None:
    settings: Settings = app.state.settings
    app.state.forecast_lock = threading.Lock()
    app.state.scheduler.add_job(
        _refresh,
        "interval",
        args=[app],
        minutes=settings.forecast_refresh_minutes,
        id="standing-forecast",
        next_run_time=datetime.now(UTC),
        max_instances=1,
        coalesce=True,
        replace_existing=True,
    )


@router.get(
    "/v1/forecast",
    summary="The standing forecast: queue, waits, utilization, completions, failures, energy, SLOs",
    responses={409: {"description": "nothing to forecast yet (no node up) or the models fail verification"}},
)
def get_forecast(
    request: Request,
    refresh: bool = Query(default=False, description="compute a new one now instead of the stored one"),
) -> dict[str, Any]:
    app = request.app
    settings: Settings = app.state.settings
    if not refresh:
        stored = latest_forecast(app.state.engine, cluster_id=settings.cluster_id, kind=STANDING)
        if stored is not None:
            created = stored.created_at if stored.created_at.tzinfo else stored.created_at.replace(tzinfo=UTC)
            age = (datetime.now(UTC) - created).total_seconds()
            # Two refresh periods: a missed refresh still serves the last one; an abandoned one does not.
            if age <= 2 * settings.forecast_refresh_minutes * 60.0:
                return stored.document | {"id": stored.id, "stored_at": created.isoformat(), "age_s": age}
    return compute_standing_forecast(app) | {"age_s": 0.0}


@router.post(
    "/v1/whatif",
    summary="A scenario against the baseline forecast on paired seeds: each difference with its interval",
    responses={409: {"description": "nothing to forecast yet (no node up) or the models fail verification"}},
    openapi_extra=access(Role.VIEWER),  # computes only, changes nothing
)
def post_whatif(body: WhatIfRequest, request: Request) -> dict[str, Any]:
    app = request.app
    settings: Settings = app.state.settings
    inputs = _live(app)
    models, source = _job_models(app)
    try:
        return run_whatif(
            inputs, models, body, _slos(app), workers=settings.forecast_workers, model_source=source
        )
    except (ClusterFormatError, ValueError) as exc:  # e.g. removing more nodes than the cluster has
        raise HTTPException(422, str(exc)) from None
