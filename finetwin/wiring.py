"""The composition root: builds the parts of finetwin from the one `Settings` object and connects them.

The four libraries never reach each other sideways: what ingest runs after each batch (calibrate's live
predictions), which models a forecast uses (calibrate's registry), where the API's approved actions go
(ingest's Kafka producer) is decided here. Heavy imports (pandas, scikit-learn, Kafka, FastAPI) happen
inside the functions so `finetwin --help` stays fast.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from finetwin.errors import CommandError
from finetwin.settings import Settings

if TYPE_CHECKING:
    from datetime import datetime

    import pandas as pd
    from fastapi import FastAPI
    from sqlalchemy import Engine

    from advisor.outbox import OutboxRelay
    from advisor.parts import ApiParts
    from calibrate.live_error import DriftCallback
    from ingest.apply import BatchHook
    from ingest.bus import Bus
    from ingest.worker import IngestWorker
    from twin.protocols import JobModels

log = logging.getLogger(__name__)


# --- the store


def migrated_engine(settings: Settings) -> Engine:
    """The store's engine, its schema brought to the newest migration (a clear error if it cannot open)."""
    from sqlalchemy.exc import DBAPIError

    from finetwin.schema import StoreError, migrate, store_failure
    from twin.db import engine_from_settings

    engine = engine_from_settings(settings)
    try:
        migrate(engine)
    except (DBAPIError, StoreError) as exc:
        engine.dispose()
        url = engine.url.render_as_string(hide_password=True)
        raise CommandError(f"cannot open the store at {url}: {store_failure(exc)}") from exc
    return engine


# --- models and benchmarks (calibrate)


def load_job_models(settings: Settings, models_dir: Path | None = None) -> JobModels | None:
    """The calibrated models in use (from their serving snapshot, else the registry), or None when none has
    been fitted yet."""
    from calibrate.registry import ModelRegistry, load_in_use_quickly

    loaded = load_in_use_quickly(ModelRegistry(models_dir or settings.resolved_models_dir()))
    return loaded[1] if loaded else None


def load_job_models_at(
    settings: Settings, at: datetime, models_dir: Path | None = None
) -> tuple[str, JobModels] | None:
    """The version that was in use at telemetry time `at` and was fitted on nothing after it, or None."""
    from calibrate.registry import ModelRegistry, load_quickly

    registry = ModelRegistry(models_dir or settings.resolved_models_dir())
    version = registry.version_in_use_at(at)
    return None if version is None else (version, load_quickly(registry, version))


def load_benchmark_table(path: Path) -> pd.DataFrame:
    """A benchmark CSV, validated and typed (raises calibrate.loader.BenchmarkFormatError)."""
    from calibrate.loader import load_benchmark

    return load_benchmark(path)


def bundled_benchmark_path() -> Path:
    """The real LLMFineTuningBench sample shipped with finetwin (the default benchmark to replay)."""
    from calibrate.loader import bundled_benchmark_path as bundled

    return bundled()


def fit_benchmark_models(path: Path, seed: int = 0) -> JobModels:
    """Models calibrated on one benchmark file, in memory and not registered (backtests on that file).
    Raises BenchmarkFormatError for a bad file."""
    from datetime import UTC, datetime

    from calibrate.dataset import WeightPolicy, assemble, load_benchmarks
    from calibrate.fit import fit_models

    tables, described = load_benchmarks([path])
    data = assemble(tables, None, now=datetime.now(UTC), policy=WeightPolicy(), described=described)
    return fit_models(data.table, data.weights, seed=seed)


# --- telemetry (ingest)


def kafka_bootstrap(option: str | None, settings: Settings) -> str:
    from ingest.settings import bootstrap_problem

    bootstrap = option or settings.kafka_bootstrap
    if not bootstrap:
        raise CommandError(
            "no Kafka to talk to: pass --bootstrap HOST:PORT or set FINETWIN_KAFKA_BOOTSTRAP "
            "(`finetwin up` starts a broker of its own)"
        )
    problem = bootstrap_problem(bootstrap)  # the setting's was checked as it was read
    if problem is not None:
        raise CommandError(f"--bootstrap: {problem}")
    return bootstrap


def ensure_topics(bus: Bus, settings: Settings, topic: str) -> None:
    from kafka.errors import KafkaError

    try:
        bus.ensure_topic(topic, settings.telemetry_partitions)
        bus.ensure_topic(settings.dlq_topic, 1)
    except KafkaError as exc:
        raise CommandError(f"cannot reach Kafka to create topic {topic}: {exc}") from exc


def ingest_batch_hooks(settings: Settings, on_drift: DriftCallback | None = None) -> list[BatchHook]:
    """What ingest runs inside each batch's transaction after applying it: the models in use predict each
    submitted job and score each ended one (calibrate.live_error); `on_drift` hears when that error drifts."""
    from calibrate.live_error import prediction_hook

    return [prediction_hook(settings, on_drift=on_drift)]


def ingest_worker(
    bus: Bus,
    engine: Engine,
    settings: Settings,
    topic: str,
    group: str | None = None,
    batch_size: int | None = None,
    on_drift: DriftCallback | None = None,
) -> IngestWorker:
    from ingest.worker import IngestWorker

    return IngestWorker(
        engine, bus.consumer(topic, group or settings.consumer_group), bus.producer(),
        dlq_topic=settings.dlq_topic, hooks=ingest_batch_hooks(settings, on_drift),
        batch_size=batch_size or settings.ingest_batch_size, poll_timeout_ms=settings.ingest_poll_timeout_ms,
        max_clock_skew=settings.max_clock_skew,
    )  # fmt: skip


# --- the API (advisor)


def api_parts(settings: Settings, engine: Engine, *, kafka_bootstrap: str | None = None) -> ApiParts:
    """The API's parts: the registry's models in use, the scheduler with the online refits on it, and the
    outbox relay that publishes approved actions to `kafka_bootstrap` (else FINETWIN_KAFKA_BOOTSTRAP; with
    neither, approved actions wait in the outbox). CommandError when the SLOs in force cannot be read."""
    from advisor.parts import ApiParts
    from advisor.slos_in_force import current_slos
    from twin.slo_attainment import SloFormatError

    try:
        # The app checks them too as it starts, but there uvicorn said "Application startup failed" with a
        # traceback (and `finetwin up`, "cannot serve the API on HOST:PORT").
        current_slos(engine, settings)
    except SloFormatError as exc:
        raise CommandError(f"the SLO file (FINETWIN_SLO_FILE): {exc}") from None
    bootstrap = kafka_bootstrap or settings.kafka_bootstrap
    relay = outbox_relay(engine, bootstrap) if bootstrap else None
    return ApiParts.assemble(settings, engine, outbox_relay=relay)


def outbox_relay(engine: Engine, bootstrap: str) -> OutboxRelay:
    """The advisor's outbox relay, publishing through ingest's acknowledged publisher (the Kafka client
    settings live in ingest; the advisor only sees the `ActionsChannel` interface)."""
    from advisor.outbox import OutboxRelay
    from ingest.acked import AckedPublisher

    return OutboxRelay(engine, AckedPublisher(bootstrap))


def api_app(parts: ApiParts) -> FastAPI:
    from advisor.app import create_app

    return create_app(parts)
