"""Forecasts and what-ifs over HTTP.

`GET /v1/forecast` returns the latest standing forecast; when there is none or it is stale on the twin's
clock, one computed for the asking (kept in memory for `FINETWIN_FORECAST_MIN_WALL_SECONDS`, never stored:
a GET writes nothing). `POST /v1/forecast/refresh` (operator) computes and stores a new standing forecast
now, at most once per `FINETWIN_FORECAST_REFRESH_MIN_SECONDS`. `GET /v1/forecast/skill` is how well the
stored forecasts did against what then happened, and `GET /v1/forecast/vs-actual` one stored forecast with
the actuals drawn over it (the dashboard's charts).

`POST /v1/whatif` compares a scenario with the baseline on paired seeds. Its size (nodes, GPUs, jobs x runs,
intervals) is bounded and checked before anything runs (422), and it stops when the client disconnects.

The twin's clock is the telemetry's (`twin.clock`): the lifespan puts a tick on the app's scheduler every
`FINETWIN_FORECAST_MIN_WALL_SECONDS`; a tick makes a new standing forecast once `FINETWIN_FORECAST_EVERY`
of telemetry time has passed since the last one's start, and scores every stored interval that telemetry
time has passed (`twin.skill`). A replay at --speed 600 is so forecast and scored within minutes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, StrictInt

from advisor.auth import Role, access
from advisor.deps import get_runtime
from advisor.parts import ApiRuntime, ShuttingDown
from advisor.routers.forecast_schemas import ForecastOut, SkillOut, VsActualOut, WhatIfOut
from advisor.settings import AdvisorSettings
from advisor.slos_in_force import current_slos
from advisor.store_errors import log_failure
from calibrate.registry import RegistryError
from twin.band_calibration import calibrated_forecast
from twin.clock import TwinClock, as_utc, cluster_clock
from twin.cluster import ClusterFormatError
from twin.config_changes import Admission
from twin.forecast import ForecastOptions, forecast
from twin.forecast_store import STANDING, latest_forecast, save_forecast
from twin.live_state import NoClusterError, load_cluster_inputs
from twin.plan import PlanOptions
from twin.policies import Policy
from twin.protocols import JobModels
from twin.skill import forecast_vs_actual, score_due, since_time, skill
from twin.slo_attainment import SloFormatError
from twin.uncalibrated import FALLBACK_LABEL, FallbackModels
from twin.whatif import ScenarioSize, WhatIf, run_whatif, scenario_size

log = logging.getLogger("finetwin.forecast")
router = APIRouter(tags=["forecast"])

NO_STATE = 409  # nothing to forecast yet (no node up) or the models fail verification: the caller can act
MAX_API_RUNS = 64  # a what-if over HTTP is bounded: two ensembles of at most this many runs
# The rest of a what-if's size, checked against the live state before it runs. 100 entries adding 10,000
# nodes of 64 GPUs with 64 runs tied up a core for minutes; these keep one request to seconds: the twin
# simulates ~15k jobs/s on one core (2,000 queued jobs, 2 x 8 runs: 2.1 s), so the job bound is ~13 s.
MAX_WHATIF_NODES = 2_000
MAX_WHATIF_GPUS = 16_384
MAX_WHATIF_JOB_RUNS = 200_000  # jobs simulated in all: 2 ensembles x runs x (known jobs + arrivals)
MAX_WHATIF_INTERVALS = 2_000  # steps of each run's series (horizon / interval)
REFRESH_BUSY = 429
WHATIF_BUSY = 429
WHATIF_RETRY_AFTER_S = "5"  # a what-if takes seconds (MAX_WHATIF_JOB_RUNS keeps it to ~13 s of a core)


class WhatIfRequest(WhatIf):
    """A scenario: `changes` against a baseline of the live state (paired seeds)."""

    runs: StrictInt = Field(default=16, ge=1, le=MAX_API_RUNS)


class ClientGone(Exception):
    """Raised between two runs of a what-if whose client has disconnected, to stop it."""


def size_problems(size: ScenarioSize) -> list[str]:
    """What makes a what-if too big to run over HTTP (nothing: it may run)."""
    problems = cluster_and_series_problems(size.nodes, size.gpus, size.intervals)
    if size.job_runs > MAX_WHATIF_JOB_RUNS:
        problems.append(
            f"{size.job_runs} simulated jobs: 2 ensembles x {size.runs} runs x {size.jobs_per_run} jobs "
            f"(at most {MAX_WHATIF_JOB_RUNS}; fewer runs or a shorter horizon)"
        )
    return problems


def cluster_and_series_problems(nodes: int, gpus: int, intervals: int, what: str = "") -> list[str]:
    """The bounds a what-if's cluster and series keep, and each scenario of a plan (`what`: "a scenario of
    " to say so)."""
    problems = []
    if nodes > MAX_WHATIF_NODES:
        problems.append(f"{what}{nodes} nodes (at most {MAX_WHATIF_NODES})")
    if gpus > MAX_WHATIF_GPUS:
        problems.append(f"{what}{gpus} GPUs (at most {MAX_WHATIF_GPUS})")
    if intervals > MAX_WHATIF_INTERVALS:
        problems.append(f"{intervals} intervals (at most {MAX_WHATIF_INTERVALS}; a longer interval)")
    return problems


def _job_models(runtime: ApiRuntime) -> tuple[JobModels | None, str]:
    cache = runtime.models_in_use
    try:
        loaded = cache.get()
    except RegistryError as exc:
        raise HTTPException(NO_STATE, f"the models in use fail verification: {exc}") from None
    if loaded is None:
        return FallbackModels(), FALLBACK_LABEL
    version, models = loaded
    return models, f"calibrated {version}"


def _options(settings: AdvisorSettings) -> ForecastOptions:
    return ForecastOptions(
        horizon_s=settings.forecast_horizon_hours * 3600.0,
        interval_s=settings.forecast_interval_minutes * 60.0,
        runs=settings.forecast_runs,
        seed=settings.forecast_seed,
        policy=Policy(settings.forecast_policy),
        plan=PlanOptions(admission=Admission(settings.forecast_admission)),
        workers=settings.forecast_workers,
        ray_address=settings.ray_address,  # the standing forecast's ensemble on Ray when one is given
    )


def _slos(runtime: ApiRuntime) -> Any:
    """The SLOs in force: the last set declared with PUT /v1/slos, else the file, else the defaults."""
    try:
        return current_slos(runtime.engine, runtime.settings).slos
    except SloFormatError as exc:
        raise HTTPException(NO_STATE, str(exc)) from None


def _clock(runtime: ApiRuntime) -> TwinClock:
    return cluster_clock(runtime.engine, runtime.settings)


def _live(runtime: ApiRuntime, clock: TwinClock | None = None) -> Any:
    settings: AdvisorSettings = runtime.settings
    try:
        return load_cluster_inputs(runtime.engine, settings, clock=clock or _clock(runtime))
    except NoClusterError as exc:
        raise HTTPException(NO_STATE, str(exc)) from None


def _calibrated(runtime: ApiRuntime, document: dict[str, Any]) -> dict[str, Any]:
    """The forecast's bands recalibrated on the cluster's scored forecasts (twin.band_calibration)."""
    settings: AdvisorSettings = runtime.settings
    if not settings.forecast_band_calibration:
        return document
    window = timedelta(days=settings.forecast_lookback_days)
    return calibrated_forecast(runtime.engine, settings.cluster_id, document, window)


def compute_standing_forecast(runtime: ApiRuntime, clock: TwinClock | None = None) -> dict[str, Any]:
    """A forecast from the live state with the cluster's settings, stored as the standing one."""
    settings: AdvisorSettings = runtime.settings
    models, source = _job_models(runtime)
    document = _calibrated(runtime, forecast(
        _live(runtime, clock), models, _options(settings), _slos(runtime), model_source=source,
        progress=runtime.check_stopping,
    ))  # fmt: skip
    document["id"] = save_forecast(runtime.engine, document, cluster_id=settings.cluster_id, kind=STANDING)
    return document


def forecast_due(runtime: ApiRuntime, clock: TwinClock) -> bool:
    """Whether `FINETWIN_FORECAST_EVERY` of the twin's time has passed since the last standing forecast."""
    settings: AdvisorSettings = runtime.settings
    last = latest_forecast(runtime.engine, cluster_id=settings.cluster_id, kind=STANDING)
    if last is None or last.start is None:
        return True
    return (clock.now - as_utc(last.start)).total_seconds() >= settings.forecast_every


def standing_tick(runtime: ApiRuntime) -> None:
    """One tick of the scheduler: a standing forecast when one is due, then score what telemetry passed."""
    lock: threading.Lock = runtime.forecast_lock
    if not lock.acquire(blocking=False):
        return  # the previous tick is still running: skip this one rather than pile up
    settings: AdvisorSettings = runtime.settings
    try:
        clock = _clock(runtime)
        if forecast_due(runtime, clock):
            compute_standing_forecast(runtime, clock)
        score_due(runtime.engine, settings.cluster_id, clock.now)
    except ShuttingDown:
        log.info("standing forecast abandoned: the API is stopping")
    except HTTPException as exc:
        log.info("standing forecast not refreshed: %s", exc.detail)
    except Exception as exc:  # the scheduler must keep running; the next tick tries again
        log_failure(log, "standing forecast refresh failed", exc)
    finally:
        lock.release()


def _unstored_forecast(runtime: ApiRuntime, clock: TwinClock) -> dict[str, Any]:
    """A forecast for a reader when no fresh standing one is stored: computed at most once per
    `FINETWIN_FORECAST_MIN_WALL_SECONDS` (and one at a time), kept in memory, never written."""
    settings: AdvisorSettings = runtime.settings
    with runtime.unstored_forecast_lock:
        kept = runtime.unstored_forecast
        if kept is not None and time.monotonic() - kept[0] < settings.forecast_min_wall_seconds:
            return kept[1] | {"age_s": 0.0, "age_wall_s": time.monotonic() - kept[0]}
        models, source = _job_models(runtime)
        document = _calibrated(runtime, forecast(
            _live(runtime, clock), models, _options(settings), _slos(runtime), model_source=source
        ))  # fmt: skip
        runtime.unstored_forecast = (time.monotonic(), document)
        return document | {"age_s": 0.0, "age_wall_s": 0.0}


def schedule_standing_forecast(runtime: ApiRuntime) -> None:
    """The standing forecast's tick on the API's scheduler (started by the lifespan)."""
    settings: AdvisorSettings = runtime.settings
    runtime.scheduler.add_job(
        standing_tick,
        "interval",
        args=[runtime],
        seconds=settings.forecast_min_wall_seconds,
        id="standing-forecast",
        next_run_time=datetime.now(UTC),
        max_instances=1,
        coalesce=True,
        replace_existing=True,
    )


def _documented(schema: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The answer's schema in the OpenAPI document, without validating each answer against it
    (`advisor.routers.forecast_schemas` says why)."""
    return {200: {"model": schema, "description": schema.__doc__ or "the answer"}}


_NO_STATE_RESPONSE: dict[int | str, dict[str, Any]] = {
    409: {"description": "nothing to forecast yet (no node up) or the models fail verification"}
}


@router.get(
    "/v1/forecast",
    summary="The standing forecast: queue, waits, utilization, completions, failures, energy, SLOs",
    description="The stored standing forecast while it is fresh (two periods of the twin's clock); "
    "otherwise one computed for the asking, not stored. A GET never writes: operators refresh with "
    "POST /v1/forecast/refresh.",
    response_model=None,
    responses=_documented(ForecastOut) | _NO_STATE_RESPONSE,
)
def get_forecast(runtime: ApiRuntime = Depends(get_runtime)) -> dict[str, Any]:
    settings: AdvisorSettings = runtime.settings
    clock = _clock(runtime)
    stored = latest_forecast(runtime.engine, cluster_id=settings.cluster_id, kind=STANDING)
    if stored is not None and stored.start is not None:
        created = as_utc(stored.created_at)
        # Its age on the twin's clock (telemetry time since it started) and on the wall's.
        age = (clock.now - as_utc(stored.start)).total_seconds()
        age_wall = (datetime.now(UTC) - created).total_seconds()
        # Two periods: a missed refresh still serves the last one; an abandoned one does not. Stale
        # only on both clocks: a replay at --speed 600 passes two periods of telemetry time in a
        # second, and every page load would otherwise recompute the ensemble.
        if age <= 2 * settings.forecast_every or age_wall <= 2 * settings.forecast_min_wall_seconds:
            return stored.document | {
                "id": stored.id,
                "stored_at": created.isoformat(),
                "age_s": age,
                "age_wall_s": age_wall,
            }
    return _unstored_forecast(runtime, clock)


@router.post(
    "/v1/forecast/refresh",
    summary="Compute and store a new standing forecast now (operator; at most one per "
    "FINETWIN_FORECAST_REFRESH_MIN_SECONDS)",
    response_model=None,
    responses=_documented(ForecastOut)
    | _NO_STATE_RESPONSE
    | {REFRESH_BUSY: {"description": "refreshed moments ago, or refreshing"}},
)
def refresh_forecast(runtime: ApiRuntime = Depends(get_runtime)) -> dict[str, Any]:
    settings: AdvisorSettings = runtime.settings
    lock: threading.Lock = runtime.forecast_lock  # shared with the scheduler's tick
    if not lock.acquire(blocking=False):
        busy = "a refresh is running; GET /v1/forecast when it is done"
        raise HTTPException(REFRESH_BUSY, busy, headers={"Retry-After": "5"})
    try:
        period = settings.forecast_refresh_min_seconds
        wait_s = runtime.last_requested_refresh + period - time.monotonic()
        if wait_s > 0:
            raise HTTPException(
                REFRESH_BUSY,
                f"refreshed less than {period:g} s ago; retry in {wait_s:.0f} s",
                headers={"Retry-After": str(math.ceil(wait_s))},
            )
        runtime.last_requested_refresh = time.monotonic()
        return compute_standing_forecast(runtime) | {"age_s": 0.0, "age_wall_s": 0.0}
    finally:
        lock.release()


def parse_since(text: str | None, now: datetime) -> datetime | None:
    """`since` as an RFC 3339 time, or as a duration back from the twin's now (`24h`, `7d`)."""
    if text is None or not text.strip():
        return None
    try:
        return since_time(text, now)
    except ValueError as exc:
        raise HTTPException(422, f"since: {exc}") from None


@router.get(
    "/v1/forecast/skill",
    response_model=SkillOut,
    summary="How the stored forecasts did: per figure, error and p10-p90 coverage over the scored intervals",
)
def get_skill(
    runtime: ApiRuntime = Depends(get_runtime),
    since: str | None = Query(
        default=None,
        max_length=64,
        description="only intervals from this time on: RFC 3339, or a duration back (24h)",
    ),
) -> dict[str, Any]:
    settings: AdvisorSettings = runtime.settings
    clock = _clock(runtime)
    out = skill(runtime.engine, settings.cluster_id, parse_since(since, clock.now))
    return out | {"clock": clock.describe()}


@router.get(
    "/v1/forecast/vs-actual",
    summary="A stored forecast's bands with what then happened, per figure, and its age on the twin's clock",
    response_model=None,
    responses=_documented(VsActualOut) | {404: {"description": "no stored forecast yet"}},
)
def get_forecast_vs_actual(runtime: ApiRuntime = Depends(get_runtime)) -> dict[str, Any]:
    settings: AdvisorSettings = runtime.settings
    clock = _clock(runtime)
    out = forecast_vs_actual(runtime.engine, settings.cluster_id, clock.now)
    if out is None:
        raise HTTPException(
            404, "no stored forecast yet: the standing forecast is made once the store has a cluster"
        )
    return out | {"clock": clock.describe()}


@router.post(
    "/v1/whatif",
    summary="A scenario against the baseline forecast on paired seeds: each difference with its interval",
    response_model=None,
    responses=_documented(WhatIfOut)
    | _NO_STATE_RESPONSE
    | {
        WHATIF_BUSY: {
            "description": "FINETWIN_WHATIF_CONCURRENCY what-ifs are running; retry after Retry-After"
        }
    },
    openapi_extra=access(Role.VIEWER),  # computes only, changes nothing
)
async def post_whatif(
    body: WhatIfRequest, request: Request, runtime: ApiRuntime = Depends(get_runtime)
) -> dict[str, Any]:
    # Async, so that it can watch the connection while the ensembles run in the thread pool.
    settings: AdvisorSettings = runtime.settings
    if not runtime.whatif_slots.acquire(blocking=False):
        running = f"{settings.whatif_concurrency} what-if{'s' if settings.whatif_concurrency > 1 else ''}"
        raise HTTPException(
            WHATIF_BUSY,
            f"{running} already running here (FINETWIN_WHATIF_CONCURRENCY); retry in a few seconds",
            headers={"Retry-After": WHATIF_RETRY_AFTER_S},
        )
    try:
        return await _whatif(body, request, runtime)
    finally:
        runtime.whatif_slots.release()


async def _whatif(body: WhatIfRequest, request: Request, runtime: ApiRuntime) -> dict[str, Any]:
    settings: AdvisorSettings = runtime.settings
    inputs = await run_in_threadpool(_live, runtime)
    try:
        problems = size_problems(scenario_size(inputs, body))
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    if problems:
        raise HTTPException(422, "the what-if is too big to run here: " + "; ".join(problems))
    models, source = await run_in_threadpool(_job_models, runtime)
    slos = await run_in_threadpool(_slos, runtime)
    stop = threading.Event()
    finished = 0

    def progress() -> None:
        nonlocal finished
        finished += 1
        if stop.is_set():
            raise ClientGone

    def compute() -> dict[str, Any]:
        workers = settings.forecast_workers
        return run_whatif(
            inputs,
            models,
            body,
            slos,
            workers=workers,
            model_source=source,
            progress=progress,
            ray_address=settings.ray_address,
        )

    work = asyncio.ensure_future(run_in_threadpool(compute))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not work.done():
        stop.set()  # the runs in flight finish, no other starts
        await asyncio.wait({work})
    try:
        return work.result()
    except ClientGone:
        log.info("what-if stopped after %d of %d runs: the client disconnected", finished, 2 * body.runs)
        raise HTTPException(499, "the client disconnected") from None  # nobody reads it; ends the request
    except (ClusterFormatError, ValueError) as exc:  # e.g. removing more nodes than the cluster has
        raise HTTPException(422, str(exc)) from None


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: what comes next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
