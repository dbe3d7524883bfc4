"""The HTTP API and dashboard: `create_app(settings)` wires the store and the routers; nothing happens at
import time. One router per resource lives in `advisor/routers/`."""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import Engine

from advisor.auth import V1_PREFIX, authorize
from twin.db import engine_from_settings, migrate
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


def create_app(settings: Settings, engine: Engine | None = None, *, run_migrations: bool = True) -> FastAPI:
    engine = engine or engine_from_settings(settings)
    if run_migrations:
        migrate(engine)
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

    app = FastAPI(
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

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # A bad request says what is wrong, field by field, with a 422.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:5])
        return JSONResponse(status_code=422, content={"detail": detail, "errors": errors})

    return app
