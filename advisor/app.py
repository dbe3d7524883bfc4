"""The HTTP API and dashboard: `create_app(parts)` builds the app from its parts (advisor.parts); nothing
happens at import time. One router per resource lives in `advisor/routers/`, each included here.

The lifespan starts, in order, what runs beside the requests: the SLO file's check, the online refits,
the standing forecast, the recommendations' expiry and steering, the outbox relay, then the scheduler
that runs the periodic ones; it stops them in reverse.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from fastapi_offline import FastAPIOffline

from advisor.answer_cache import AnswerCache
from advisor.auth import V1_PREFIX, FailureLimiter, KeyCache, authorize
from advisor.batching import Batcher
from advisor.errors import document_errors, install_error_handlers
from advisor.fastpath import RepeatedAdviceFastPath
from advisor.guards import RequestGuard
from advisor.head_requests import HeadAsGet
from advisor.outbox import RelayThread
from advisor.parts import ApiParts, ApiRuntime
from advisor.plan_jobs import PlanJobs
from advisor.query_params import reject_unknown_query
from advisor.retention_job import schedule_pruning
from advisor.routers import (
    advise,
    audit,
    cluster,
    dashboard,
    forecast,
    health,
    jobs,
    models,
    plan,
    recommendations,
    slos,
)
from twin.executors import set_worker_niceness

ROUTERS: tuple[APIRouter, ...] = (
    health.router,
    jobs.router,
    cluster.router,
    forecast.router,
    models.router,
    advise.router,
    slos.router,
    recommendations.router,
    plan.router,
    audit.router,
    dashboard.router,
)


def serves_v1(router: APIRouter) -> bool:
    return any(getattr(route, "path", "").startswith(V1_PREFIX) for route in router.routes)


def build_runtime(parts: ApiParts) -> ApiRuntime:
    settings = parts.settings
    runtime = ApiRuntime(
        parts=parts,
        key_cache=KeyCache(
            parts.engine,
            ttl_s=settings.auth_cache_seconds,
            negative_ttl_s=settings.auth_negative_cache_seconds,
        ),
        auth_failures=FailureLimiter(settings.auth_max_failures, settings.auth_failure_window_seconds),
        answer_cache=AnswerCache(settings.advice_cache_size),
        plan_jobs=PlanJobs(parts.engine, settings.cluster_id),
        whatif_slots=threading.BoundedSemaphore(settings.whatif_concurrency),
    )
    # Uncached advice is computed in batches; the models in use are looked up per batch.
    runtime.batcher = Batcher(lambda bodies: advise.answers(runtime, bodies), settings.advice_max_batch)
    return runtime


def create_app(parts: ApiParts) -> FastAPI:
    """The app on `parts.engine`'s store, whose schema is current (the application migrates it)."""
    runtime = build_runtime(parts)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # The heap of the imports (hundreds of thousands of objects, none of them ever garbage) out of the
        # collector's reach: its first full pass over them stalled every request in flight for ~250 ms
        # (bench/api.py, 50 clients x 1/s: p99 166 -> 87 ms). Later objects are collected as before.
        gc.collect()
        gc.freeze()
        # The twin's work shares the machine with the requests: its worker processes niced, and the threads
        # that run it here (small forecasts, steering's preparation of its what-ifs) made to hand the
        # interpreter to a waiting request sooner (bench/busy_latency.py).
        niceness = set_worker_niceness(parts.settings.twin_worker_nice)
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(parts.settings.api_switch_interval_ms / 1000.0)
        slos.check_slo_file(runtime)
        if parts.refits is not None:
            parts.refits.install()
        forecast.schedule_standing_forecast(runtime)
        recommendations.schedule_expiry_and_steering(runtime)
        schedule_pruning(runtime)
        if parts.outbox_relay is not None:
            runtime.relay = RelayThread(parts.outbox_relay, poll_s=parts.settings.relay_poll_seconds).start()
            runtime.relay.wake()  # publish whatever an earlier process left unsent
        if parts.settings.scheduler_enabled:
            parts.scheduler.start()
        try:
            yield
        finally:
            # The scheduler's running forecast or steering stops after its runs in flight (a second or
            # two), and is waited for: left running, its process pool met the interpreter's exit and
            # hung `finetwin up` after Ctrl-C.
            runtime.stopping.set()
            if parts.refits is not None:
                parts.refits.stop()  # a refit in its own process is abandoned, not waited for
            if parts.scheduler.running:
                parts.scheduler.shutdown(wait=True)
            if runtime.relay is not None:
                runtime.relay.stop()
                runtime.relay = None
            runtime.plan_jobs.pool.shutdown(wait=True, cancel_futures=True)  # a running plan stops soon too
            runtime.plan_jobs.close()  # the plans that never started, failed in the store, saying why
            set_worker_niceness(niceness)  # the process as it was (an app in a test, a command after it)
            sys.setswitchinterval(switch_interval)

    # /docs (Swagger UI) and /redoc from files the fastapi-offline package ships, not from a CDN: the API's
    # documentation works on a machine without internet, as the dashboard does with its vendored Chart.js.
    app = FastAPIOffline(
        title="finetwin",
        version="0.1.0",
        description="Digital twin of a GPU cluster running LLM fine-tuning jobs: state, forecasts, advice.",
        lifespan=lifespan,
    )
    app.state.runtime = runtime  # the one thing in the app's state, read through advisor.deps
    for router in ROUTERS:
        if serves_v1(router):
            # Every /v1 route needs a key (reads any role, writes operator+; see advisor.auth), then
            # refuses query parameters it does not take (advisor.query_params).
            app.include_router(router, dependencies=[Depends(authorize), Depends(reject_unknown_query)])
        else:
            app.include_router(router)

    # A repeated advice request (same bytes, same models, a key verified moments ago) is answered before
    # FastAPI parses it: see advisor.fastpath.
    if parts.settings.advice_fast_path:
        app.add_middleware(RepeatedAdviceFastPath, runtime=runtime)
    # Added last but one, so outermost but for HEAD's: no body over the limit and no NUL character
    # reaches anything else.
    # The guard also refuses an address that failed too many key checks: it reads the runtime's key
    # cache and failure limiter.
    app.add_middleware(RequestGuard, max_body_bytes=parts.settings.max_body_bytes, state=runtime)
    app.add_middleware(HeadAsGet)  # outermost: a HEAD is a GET to everything inside (advisor.head_requests)
    install_error_handlers(app)
    app.openapi = document_errors(app)  # type: ignore[method-assign]
    return app
