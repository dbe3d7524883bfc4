"""What the API is built from (`ApiParts`, assembled by the application's wiring or by a test) and what
`create_app` builds from them once, before the first request (`ApiRuntime`). The routers reach both only
through the dependencies of `advisor.deps`; nothing is built lazily on a request."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Engine

from advisor.settings import AdvisorSettings
from advisor.single_flight import SingleFlight

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

    from advisor.answer_cache import AnswerCache
    from advisor.auth import FailureLimiter, KeyCache
    from advisor.batching import Batcher
    from advisor.outbox import OutboxRelay, RelayThread
    from calibrate.refit import RefitScheduler


class ModelsInUse(Protocol):
    """The calibrated models in use: `calibrate.registry.InUseModels` (a cache over the registry)."""

    def get(self) -> tuple[str, Any] | None: ...

    def version_in_use(self) -> str | None: ...

    def tree_engine(self) -> str | None: ...


@dataclass(frozen=True)
class ApiParts:
    """The API's collaborators. `scheduler` runs its periodic work (refits, standing forecast, steering);
    `refits` is the online refit scheduler (the wiring connects ingest's drift hook to it when ingest runs in
    the same process); `outbox_relay` publishes approved actions (None: they wait in the outbox)."""

    settings: AdvisorSettings
    engine: Engine
    models_in_use: ModelsInUse
    scheduler: BaseScheduler
    refits: RefitScheduler | None = None
    outbox_relay: OutboxRelay | None = None

    @classmethod
    def assemble(
        cls,
        settings: AdvisorSettings,
        engine: Engine,
        *,
        models_in_use: ModelsInUse | None = None,
        outbox_relay: OutboxRelay | None = None,
    ) -> ApiParts:
        """The usual parts: the registry's models in use, a background scheduler and the refits on it (none
        with `FINETWIN_REFITS=false`)."""
        from apscheduler.schedulers.background import BackgroundScheduler

        from calibrate.refit import RefitScheduler
        from calibrate.registry import InUseModels

        scheduler = BackgroundScheduler(timezone="UTC")
        models = models_in_use if models_in_use is not None else InUseModels(settings.resolved_models_dir())
        refits = RefitScheduler(settings, engine, scheduler) if settings.refits else None
        return cls(settings, engine, models, scheduler, refits, outbox_relay)


class ShuttingDown(Exception):
    """Background work (a standing forecast, a steering run) abandoned because the app is stopping."""


@dataclass
class ApiRuntime:
    """The parts plus what the API builds from them once: caches, the advice batcher, the relay's thread,
    the capacity plans' pool. Built by `create_app`; started and stopped by its lifespan."""

    parts: ApiParts
    key_cache: KeyCache
    auth_failures: FailureLimiter
    answer_cache: AnswerCache
    plan_jobs: Any  # advisor.plan_jobs.PlanJobs
    whatif_slots: threading.BoundedSemaphore  # POST /v1/whatif's (FINETWIN_WHATIF_CONCURRENCY)
    batcher: Batcher[Any, tuple[str, bytes]] | None = None  # set by create_app (it calls back into this)
    relay: RelayThread | None = None  # started by the lifespan when there is an outbox relay
    last_steering: dict[str, Any] | None = None  # the last steering run's outcome, for the dashboard
    steering: SingleFlight[Any] = field(default_factory=SingleFlight)  # one steering run at a time
    forecast_lock: threading.Lock = field(default_factory=threading.Lock)  # the standing forecast's
    # A forecast computed for a reader when no fresh standing one is stored: (monotonic time, document).
    unstored_forecast: tuple[float, dict[str, Any]] | None = None
    unstored_forecast_lock: threading.Lock = field(default_factory=threading.Lock)
    last_requested_refresh: float = -math.inf  # POST /v1/forecast/refresh is rate-limited
    # Set when the app stops: the scheduler's forecasts and steering stop after the ensemble runs in flight
    # (they check it between runs), so shutting down never waits for a whole ensemble nor leaves one behind.
    stopping: threading.Event = field(default_factory=threading.Event)

    def check_stopping(self) -> None:
        """An ensemble's progress callback: raises `ShuttingDown` once the app is stopping."""
        if self.stopping.is_set():
            raise ShuttingDown("the API is stopping")

    @property
    def settings(self) -> AdvisorSettings:
        return self.parts.settings

    @property
    def engine(self) -> Engine:
        return self.parts.engine

    @property
    def models_in_use(self) -> ModelsInUse:
        return self.parts.models_in_use

    @property
    def scheduler(self) -> BaseScheduler:
        return self.parts.scheduler
