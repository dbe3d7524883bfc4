"""Forecasts: an ensemble of seeded runs from a starting state, reported as mean and p10/p90 across runs.

The starting state is either the live one (`twin.live_state`: the store's nodes, queued and running jobs,
and the observed arrival process) or an explicit cluster and workload (`finetwin simulate`). The models are
asked once, here, before the runs fan out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import numpy as np

from twin.arrivals import ArrivalModel
from twin.cluster import Cluster
from twin.domain import JobConfig
from twin.ensemble import EnsembleSpec, RunOutput, run_ensemble, summarize
from twin.jsonsafe import json_safe
from twin.observed_outcomes import ObservedOutcomes
from twin.plan import PlanOptions, PreparedCatalog, prepare_catalog
from twin.policies import DEFAULT_BACKFILL_DEPTH, Policy
from twin.protocols import JobModels
from twin.slo_attainment import DEFAULT_SLOS, SloSet
from twin.uncalibrated import FALLBACK_LABEL, FallbackModels
from twin.workload import Workload

if TYPE_CHECKING:
    from twin.job_health import Attention


@dataclass
class TwinInputs:
    """Where a forecast starts from."""

    cluster: Cluster
    workload: Workload  # jobs known at time 0 (queued, running, or an explicit workload)
    arrivals: ArrivalModel | None = None
    failure_times_s: np.ndarray | None = None  # observed seconds-to-failure of runtime failures
    start: datetime | None = None  # wall-clock time of simulation time 0 (live forecasts)
    notes: list[str] = field(default_factory=list)  # what was left out or assumed, for the reader
    clock: dict[str, object] | None = None  # live forecasts: which clock `start` was read from (twin.clock)
    # Live forecasts: the running jobs of `workload` that need a person's attention (twin.job_health), by id.
    attention: dict[str, Attention] = field(default_factory=dict)
    # Live forecasts: how the cluster's runs ended, which the uncalibrated fallback's failures follow.
    outcomes: ObservedOutcomes | None = None


@dataclass(frozen=True)
class ForecastOptions:
    horizon_s: float | None = 86400.0  # None: until every known job has ended (no future arrivals)
    interval_s: float = 3600.0
    runs: int = 32
    seed: int = 0
    policy: Policy = Policy.FIFO
    plan: PlanOptions = PlanOptions()
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH
    workers: int | None = None  # None: decide from the ensemble's size
    keep_jobs: bool = False  # include run 0's job table
    ray_address: str | None = None  # run the ensemble on this Ray cluster instead of local processes

    def with_changes(self, **changes: object) -> ForecastOptions:
        return replace(self, **changes)  # type: ignore[arg-type]


def catalog_of(inputs: TwinInputs) -> list[JobConfig]:
    """The configurations a run can meet, in the order `ensemble.run_workload` lays them out."""
    mix = inputs.arrivals.mix.catalog if inputs.arrivals is not None else []
    return list(inputs.workload.catalog) + list(mix)


def models_for(inputs: TwinInputs, models: JobModels | None) -> JobModels | None:
    """The models the runs ask: the uncalibrated fallback, which has no failure model, told how the
    cluster's own runs ended (a calibrated version learned failures from the benchmark, and from these
    runs once refitted with them)."""
    if isinstance(models, FallbackModels) and models.outcomes is None and inputs.outcomes is not None:
        return FallbackModels(inputs.outcomes)
    return models


def make_spec(
    inputs: TwinInputs,
    models: JobModels | None,
    options: ForecastOptions,
    slos: SloSet = DEFAULT_SLOS,
    known: PreparedCatalog | None = None,
) -> EnsembleSpec:
    """The ensemble's spec. `known`: a catalog prepared before with the same models (a what-if's
    baseline's), whose predictions the configurations it holds take instead of asking the models again."""
    if options.horizon_s is not None and options.horizon_s <= 0:
        raise ValueError("the horizon must be positive")
    if options.interval_s <= 0:
        raise ValueError("the interval must be positive")
    return EnsembleSpec(
        cluster=inputs.cluster,
        workload=inputs.workload,
        catalog=prepare_catalog(catalog_of(inputs), models_for(inputs, models), options.plan, known),
        arrivals=inputs.arrivals if options.horizon_s is not None else None,
        failure_times_s=inputs.failure_times_s,
        policy=Policy(options.policy),
        horizon_s=options.horizon_s,
        interval_s=options.interval_s,
        seed=options.seed,
        slos=slos,
        backfill_depth=options.backfill_depth,
        keep_jobs=options.keep_jobs,
    )


def describe(inputs: TwinInputs, options: ForecastOptions, model_source: str) -> dict[str, object]:
    return {
        "generated_at": datetime.now(UTC).isoformat(),
        "start": inputs.start.isoformat() if inputs.start is not None else None,
        "clock": inputs.clock,
        "horizon_s": options.horizon_s,
        "interval_s": options.interval_s,
        "runs": options.runs,
        "seed": options.seed,
        "policy": str(options.policy),
        "admission": str(options.plan.admission),
        "optimizations": sorted(str(o) for o in options.plan.optimizations),
        "right_size_batches": options.plan.right_size_batches,
        "models": model_source,
        "cluster": inputs.cluster.describe(),
        "known_jobs": {
            "total": len(inputs.workload),
            "running": len(inputs.workload.running),
            "queued": len(inputs.workload) - len(inputs.workload.running),
        },
        "arrivals_per_day": inputs.arrivals.daily_jobs if inputs.arrivals is not None else 0.0,
        "notes": list(inputs.notes) + _fallback_notes(inputs, model_source),
    }


def _fallback_notes(inputs: TwinInputs, model_source: str) -> list[str]:
    if model_source != FALLBACK_LABEL or inputs.outcomes is None:
        return []
    return [inputs.outcomes.note()]


def run_forecast(
    inputs: TwinInputs,
    models: JobModels | None,
    options: ForecastOptions,
    slos: SloSet = DEFAULT_SLOS,
    progress: Callable[[], object] | None = None,
) -> tuple[EnsembleSpec, list[RunOutput]]:
    spec = make_spec(inputs, models, options, slos)
    return spec, run_ensemble(spec, options.runs, options.workers, progress, ray_address=options.ray_address)


def forecast(
    inputs: TwinInputs,
    models: JobModels | None,
    options: ForecastOptions,
    slos: SloSet = DEFAULT_SLOS,
    model_source: str = "calibrated",
    progress: Callable[[], object] | None = None,
) -> dict[str, object]:
    """The forecast as a JSON-ready dict: what it started from, `summary`, `series`, `slos` (and `jobs`)."""
    began = time.perf_counter()
    _, outputs = run_forecast(inputs, models, options, slos, progress)
    out = describe(inputs, options, model_source) | summarize(outputs, slos)
    if options.keep_jobs:
        out["jobs"] = outputs[0].jobs
    out["wall_s"] = round(time.perf_counter() - began, 3)
    return json_safe(out)
