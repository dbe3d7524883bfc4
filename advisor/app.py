"""The HTTP API and dashboard: `create_app(settings)` wires the store and the routers; nothing happens at
import time. One router per resource lives in `advisor/routers/`."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import APIRouter, Depends, FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy import Engine

from advisor.auth import V1_PREFIX, authorize, install_key_checks
from advisor.errors import document_errors, install_error_handlers
from advisor.fastpath import RepeatedAdviceFastPath
from advisor.guards import RequestGuard
from twin.settings import Settings

# Each module exposes `router` (an APIRouter); optional `startup(app)` / `shutdown(app)` run in the lifespan.
ROUTER_MODULES: tuple[str, ...] = (
    "advisor.routers.health",
    "advisor.routers.jobs",
    "advisor.routers.cluster",
    "advisor.routers.forecast",
    "advisor.routers.models",
    "advisor.routers.advise",
    "advisor.routers.slos",
    "advisor.routers.recommendations",
    "advisor.routers.plan",
    "advisor.routers.audit",
    "advisor.routers.dashboard",
)

Hook = Callable[[FastAPI], Any]


def serves_v1(router: APIRouter) -> bool:
    return any(getattr(route, "path", "").startswith(V1_PREFIX) for route in router.routes)


def create_app(settings: Settings, engine: Engine) -> FastAPI:
    """The app on `engine`'s store, whose schema is current (the application migrates it, not the API)."""
    modules = [importlib.import_module(name) for name in ROUTER_MODULES]

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # One scheduler for the periodic work of every router (refits, standing forecast, recommendations);
        # routers add their jobs in `startup` and it starts once all are in.
        app.state.scheduler = BackgroundScheduler(timezone="UTC")
        for module in modules:
            if hasattr(module, "startup"):
                module.startup(app)
        if settings.scheduler_enabled:
            app.state.scheduler.start()
        try:
            yield
        finally:
            if app.state.scheduler.running:
                app.state.scheduler.shutdown(wait=False)
            for module in reversed(modules):
                if hasattr(module, "shutdown"):
                    module.shutdown(app)

    # /docs (Swagger UI) and /redoc from files the fastapi-offline package ships, not from a CDN: the API's
    # documentation works on a machine without internet, as the dashboard does with its vendored Chart.js.
    app = FastAPIOffline(
        title="finetwin",
        version="0.1.0",
        description="Digital twin of a GPU cluster running LLM fine-tuning jobs: state, forecasts, advice.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    for module in modules:
        if serves_v1(module.router):
            # Every /v1 route needs a key (reads any role, writes operator+); see advisor.auth.
            app.include_router(module.router, dependencies=[Depends(authorize)])
        else:
            app.include_router(module.router)

    # A repeated advice request (same bytes, same models, a key verified moments ago) is answered before
    # FastAPI parses it: see advisor.fastpath.
    if settings.advice_fast_path:
        app.add_middleware(RepeatedAdviceFastPath, state=app.state)
    # Added last, so outermost: no body over the limit and no NUL character reaches anything else.
    install_key_checks(app)
    app.add_middleware(RequestGuard, max_body_bytes=settings.max_body_bytes, state=app.state)
    install_error_handlers(app)
    app.openapi = document_errors(app)  # type: ignore[method-assign]
    return app
