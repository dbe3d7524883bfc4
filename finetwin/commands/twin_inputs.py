"""What the twin's commands build from their options: forecast options, SLOs, an explicit cluster and
workload, the models a forecast uses."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from finetwin.errors import CommandError
from finetwin.settings import Settings

if TYPE_CHECKING:
    from twin.forecast import ForecastOptions
    from twin.protocols import JobModels

log = logging.getLogger(__name__)

PolicyName = Literal["fifo", "backfill", "spf", "conservative"]
AdmissionName = Literal["off", "reject", "repair"]


class OptimizationName(StrEnum):  # an enum: typer takes no list of Literal
    fast_kernels = "fast_kernels"
    roce = "roce"
    fast_moe = "fast_moe"


@dataclass(frozen=True)
class EnsembleChoices:
    """The options of an ensemble as given on the command line (None = from settings)."""

    horizon: str | None = None
    interval: str | None = None
    runs: int | None = None
    seed: int | None = None
    policy: str | None = None
    admission: str | None = None
    optimize: list[str] = field(default_factory=list)
    workers: int | None = None


def forecast_options(
    choices: EnsembleChoices, settings: Settings, default_horizon: str | None
) -> ForecastOptions:
    from twin.config_changes import Admission, Optimization
    from twin.forecast import ForecastOptions
    from twin.limits import MAX_SIMULATED_SECONDS, interval_problem, series_intervals_problem
    from twin.plan import PlanOptions
    from twin.policies import Policy
    from twin.units import parse_duration

    try:
        horizon_text = choices.horizon if choices.horizon is not None else default_horizon
        horizon = parse_duration(horizon_text) if horizon_text is not None else None
        interval = (
            parse_duration(choices.interval)
            if choices.interval is not None
            else settings.forecast_interval_minutes * 60.0
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if horizon is not None:
        if horizon > MAX_SIMULATED_SECONDS:
            raise CommandError(f"--horizon: at most {MAX_SIMULATED_SECONDS / 86400:,.0f} days (ten years)")
        # An --interval asked for and longer than the horizon is refused, as whatif and plan refuse it (the
        # settings' default interval may exceed a short --horizon: the series is then one interval).
        problem = series_intervals_problem(horizon, interval) or (
            interval_problem(horizon_text, choices.interval) if choices.interval is not None else None
        )
        if problem is not None:
            raise CommandError(problem)
    return ForecastOptions(
        horizon_s=horizon,
        interval_s=interval,
        runs=checked_runs(choices.runs if choices.runs is not None else settings.forecast_runs),
        seed=checked_seed(choices.seed if choices.seed is not None else settings.forecast_seed),
        policy=Policy(choices.policy or settings.forecast_policy),
        plan=PlanOptions(
            admission=Admission(choices.admission or settings.forecast_admission),
            optimizations=frozenset(Optimization(o) for o in choices.optimize),
        ),
        workers=settings.forecast_workers if choices.workers is None else checked_workers(choices.workers),
        ray_address=settings.ray_address,
    )


def declared_slos(settings: Settings, engine: Any = None) -> Any:
    """The SLOs in force, as the API has them: the set declared through `PUT /v1/slos` in the store, else
    FINETWIN_SLO_FILE, else the defaults. A store that does not exist yet has declared nothing."""
    from sqlalchemy.exc import SQLAlchemyError

    from advisor.slos_in_force import current_slos
    from twin.db import engine_from_settings
    from twin.slo_attainment import SloFormatError, load_slos

    own = None
    if engine is None and (settings.database_url or (settings.data_dir / "finetwin.db").exists()):
        engine = own = engine_from_settings(settings)
    try:
        if engine is not None:
            try:
                in_force = current_slos(engine, settings)
                log.info("SLOs from %s: %s", in_force.source, ", ".join(s.name for s in in_force.slos.slos))
                return in_force.slos
            except SQLAlchemyError:  # a store without the SLO table (never migrated): nothing declared there
                pass
        return load_slos(settings.slo_file)
    except SloFormatError as exc:
        raise CommandError(str(exc)) from None
    finally:
        if own is not None:
            own.dispose()


def explicit_inputs(cluster_path: Path, workload_path: Path) -> tuple[Any, Any]:
    from twin.cluster import ClusterFormatError, load_cluster
    from twin.workload import WorkloadFormatError, read_jobs_csv

    try:
        cluster, workload = load_cluster(cluster_path), read_jobs_csv(workload_path)
    except (ClusterFormatError, WorkloadFormatError) as exc:
        raise CommandError(str(exc)) from None
    unnamed = sum(1 for g in workload.gpu_models if not g)
    if unnamed and len(cluster.gpu_models) > 1:
        # The twin places a job without a GPU type only on a cluster of one type; here every such job
        # would be rejected for want of capacity (exit 0, a run that says nothing).
        raise CommandError(
            f"{workload_path}: {unnamed} of {len(workload)} jobs name no gpu_model, and {cluster_path} has "
            f"several GPU types ({', '.join(cluster.gpu_models)}): give each job a gpu_model column value"
        )
    return cluster, workload


def live_inputs(settings: Settings, engine: Any = None, clock: Any = None) -> Any:
    """The twin's inputs from the store's live state (its nodes, queue, running jobs, arrival process), at
    `clock` (twin.clock; default: the wall clock)."""

    from finetwin.wiring import migrated_engine
    from twin.live_state import NoClusterError, load_cluster_inputs

    engine = engine if engine is not None else migrated_engine(settings)
    try:
        return engine, load_cluster_inputs(engine, settings, clock=clock)
    except NoClusterError as exc:
        raise CommandError(f"{exc} (looked in the store {settings.store_description()})") from None


def needs_models(inputs: Any) -> bool:
    from twin.workload import NO_CONFIG

    if (inputs.workload.config_idx != NO_CONFIG).any():
        return True
    return inputs.arrivals is not None and bool((inputs.arrivals.mix.config_idx != NO_CONFIG).any())


def job_models(models: Path | None, settings: Settings, needed: bool) -> tuple[JobModels | None, str]:
    """The calibrated models in use; the uncalibrated fallback (with a warning) when none has been fitted."""
    from finetwin.wiring import load_job_models
    from twin.uncalibrated import FALLBACK_LABEL, FallbackModels

    if not needed:
        return None, "none (fixed durations)"
    try:
        loaded = load_job_models(settings, models)
    except Exception as exc:  # the registry refuses a tampered or unreadable version: say so, do not guess
        raise CommandError(f"the models in use cannot be loaded: {exc}") from None
    if loaded is None:
        if models is not None:
            raise CommandError(f"no calibrated model in use under {models} (run finetwin calibrate)")
        log.warning("no calibrated model in use yet: forecasting with the uncalibrated fallback")
        return FallbackModels(), FALLBACK_LABEL
    return loaded, "calibrated"


def checked_runs(runs: int) -> int:
    """--runs of an ensemble, within 1..MAX_ENSEMBLE_RUNS."""
    from twin.limits import MAX_ENSEMBLE_RUNS

    if not 1 <= runs <= MAX_ENSEMBLE_RUNS:
        raise CommandError(f"--runs must be from 1 to {MAX_ENSEMBLE_RUNS}, got {runs:,}")
    return runs


def checked_seed(seed: int) -> int:
    """--seed, as numpy's generators take it (was numpy's 'expected non-negative integer')."""
    from twin.limits import MAX_SEED

    if not 0 <= seed <= MAX_SEED:
        raise CommandError(f"--seed must be from 0 to {MAX_SEED:,}, got {seed:,}")
    return seed


def checked_workers(workers: int | None) -> int | None:
    """--workers: processes to run on, 1 or more (None: the default). 0 or a negative count was taken as 1
    without a word."""
    if workers is not None and workers < 1:
        raise CommandError(
            f"--workers must be 1 or more (the processes to run on; leave it out to have them chosen for the "
            f"work), not {workers}"
        )
    return workers


def checked(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Runs the twin; a problem with the inputs (a job without work, a scenario removing every node) is
    the user's to fix: a message, not a traceback."""
    from twin.executors import ExecutorUnavailable

    try:
        return work()
    except (ValueError, ExecutorUnavailable) as exc:  # ExecutorUnavailable: FINETWIN_RAY_ADDRESS is wrong
        raise CommandError(str(exc)) from None
