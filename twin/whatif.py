"""What-if scenarios: the same forecast with a change, compared with the baseline run by run.

Changes: nodes of a type added or removed, another scheduling policy, admission control, optimizations
switched on (fast kernels, RoCE, fast MoE: their effect comes from the models), batch right-sizing, known
jobs cancelled (a stalled job's GPUs freed now).

Baseline run i and scenario run i share their seed: the same future arrivals and the same per-job draws
(common random numbers). The reported difference is the spread of the paired differences, with a 95 %
confidence interval of its mean; a scenario that changes nothing gives exactly zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)
from scipy import stats

from twin.cluster import Cluster, ClusterFormatError
from twin.config_changes import Admission, Optimization, WrittenAdmission
from twin.domain import known_gpu_name
from twin.ensemble import RunOutput, run_ensemble, spread, summarize
from twin.forecast import ForecastOptions, TwinInputs, describe, json_safe, make_spec
from twin.limits import MAX_ENSEMBLE_RUNS, StoredId, interval_problem, simulated_duration
from twin.plan import PlanOptions
from twin.policies import Policy
from twin.protocols import JobModels
from twin.run_metrics import SUMMARY_FIGURES
from twin.slo_attainment import DEFAULT_SLOS, SloSet
from twin.units import parse_duration

Duration = Annotated[str, Field(min_length=1, max_length=32, examples=["24h", "90m"])]


class NodeChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_model: str = Field(min_length=1, max_length=100)
    add: StrictInt = Field(default=0, ge=0, le=10_000)
    remove: StrictInt = Field(default=0, ge=0, le=10_000)
    gpus_per_node: StrictInt = Field(default=8, ge=1, le=64)

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        """A misspelled type would be a phantom pool no job asks for (a difference of 0): refused, with the
        closest known names."""
        return known_gpu_name(value)


class ScenarioChanges(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[NodeChange] = Field(default_factory=list, max_length=100)
    policy: Policy | None = None
    admission: WrittenAdmission | None = None
    optimizations: list[Optimization] = Field(default_factory=list)
    right_size_batches: StrictBool = False
    # Known jobs (queued or running) that the scenario cancels now: their GPUs free, their work not done.
    cancel_jobs: list[StoredId] = Field(default_factory=list, max_length=100)

    def is_empty(self) -> bool:
        return not (
            self.nodes or self.policy or self.admission or self.optimizations or self.right_size_batches
            or self.cancel_jobs
        )  # fmt: skip


class WhatIf(BaseModel):
    """A scenario file or request body. `horizon`/`interval` are durations (`24h`) or seconds."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="what-if", max_length=200)
    # None: until every known job has ended (no future arrivals). Strict: `true` is not a duration.
    horizon: Duration | StrictFloat | None = "24h"
    interval: Duration | StrictFloat = "1h"
    runs: StrictInt = Field(default=32, ge=1, le=MAX_ENSEMBLE_RUNS)
    seed: StrictInt = Field(default=0, ge=0, le=2**63 - 1)
    policy: Policy = Policy.FIFO  # the baseline's
    admission: WrittenAdmission = Admission.OFF  # the baseline's
    changes: ScenarioChanges = Field(default_factory=ScenarioChanges)

    @field_validator("horizon", "interval")
    @classmethod
    def _duration(cls, value: str | float | None, info: ValidationInfo) -> str | float | None:
        if value is None and info.field_name == "horizon":
            return None
        if value is None:
            raise ValueError("a duration is required")
        simulated_duration(value)  # raises ValueError with the offending text
        return value

    @model_validator(mode="after")
    def _interval_within_horizon(self) -> WhatIf:
        problem = interval_problem(self.horizon, self.interval)
        if problem is not None:
            raise ValueError(problem)
        return self

    def baseline_options(self, workers: int | None = None, ray_address: str | None = None) -> ForecastOptions:
        return ForecastOptions(
            horizon_s=None if self.horizon is None else parse_duration(self.horizon),
            interval_s=parse_duration(self.interval),
            runs=self.runs,
            seed=self.seed,
            policy=self.policy,
            plan=PlanOptions(admission=self.admission),
            workers=workers,
            ray_address=ray_address,
        )


def apply_changes(
    inputs: TwinInputs, options: ForecastOptions, changes: ScenarioChanges
) -> tuple[TwinInputs, ForecastOptions]:
    cluster: Cluster = inputs.cluster
    for change in changes.nodes:
        if change.add:
            cluster = cluster.with_nodes_added(change.gpu_model, change.add, change.gpus_per_node)
        if change.remove:
            cluster = cluster.with_nodes_removed(change.gpu_model, change.remove)
    if not cluster.nodes:
        raise ClusterFormatError("the scenario removes every node")
    workload = inputs.workload
    if changes.cancel_jobs:
        unknown = sorted(set(changes.cancel_jobs) - set(workload.job_ids))
        if unknown:
            raise ValueError(
                f"cancel_jobs: {', '.join(map(repr, unknown[:5]))}"
                f"{f' and {len(unknown) - 5} more' if len(unknown) > 5 else ''} not among the known jobs "
                "(queued or running; in the store, or in the workload file)"
            )
        workload = workload.without(set(changes.cancel_jobs))
    plan = PlanOptions(
        admission=changes.admission or options.plan.admission,
        optimizations=options.plan.optimizations | frozenset(changes.optimizations),
        right_size_batches=options.plan.right_size_batches or changes.right_size_batches,
        min_p_valid=options.plan.min_p_valid,
    )
    scenario_inputs = TwinInputs(
        cluster=cluster,
        workload=workload,
        arrivals=inputs.arrivals,
        failure_times_s=inputs.failure_times_s,
        start=inputs.start,
        notes=inputs.notes,
        outcomes=inputs.outcomes,
    )
    return scenario_inputs, options.with_changes(policy=changes.policy or options.policy, plan=plan)


def scenario_notes(inputs: TwinInputs, changes: ScenarioChanges) -> list[str]:
    """What the answer's numbers need said: a scenario that changes nothing (its zero difference is by
    construction, not a finding), and added nodes that would stand idle."""
    if changes.is_empty():
        return ["the scenario changes nothing: it is the baseline, so every difference is zero"]
    return idle_additions(inputs, changes)


def idle_additions(inputs: TwinInputs, changes: ScenarioChanges) -> list[str]:
    """A note per added node type that no known job asks for and no expected arrival would (jobs name their
    GPU type): its nodes would stand idle, and the what-if's zero difference needs that said."""
    asked = set(inputs.workload.gpu_models)
    if inputs.arrivals is not None:
        asked |= set(inputs.arrivals.mix.gpu_models)
    if "" in asked:  # a job that names no GPU type may run on the added ones
        return []
    return [
        f"no known job asks for {c.gpu_model}, nor any arrival the twin expects: the {c.add} added "
        f"node(s) would stand idle"
        for c in changes.nodes
        if c.add and c.gpu_model not in asked
    ]


@dataclass(frozen=True)
class ScenarioSize:
    """How big a what-if is before it runs: the larger of its two clusters, and its simulated work."""

    nodes: int
    gpus: int
    jobs_per_run: int  # known jobs plus the arrivals expected over the horizon
    runs: int  # of each ensemble (baseline and scenario)
    intervals: int  # steps of each run's series

    @property
    def job_runs(self) -> int:
        """Jobs simulated in all: both ensembles, every run."""
        return 2 * self.runs * self.jobs_per_run


def scenario_size(inputs: TwinInputs, whatif: WhatIf) -> ScenarioSize:
    """Counted from the request and the live state alone (no simulation), so a request too big to run
    can be refused at once."""
    nodes, gpus = len(inputs.cluster.nodes), inputs.cluster.total_gpus
    added = sum(c.add for c in whatif.changes.nodes)
    added_gpus = sum(c.add * c.gpus_per_node for c in whatif.changes.nodes)
    horizon_s = None if whatif.horizon is None else parse_duration(whatif.horizon)
    jobs = len(inputs.workload)
    if horizon_s is not None and inputs.arrivals is not None:
        jobs += math.ceil(inputs.arrivals.daily_jobs * horizon_s / 86400.0)
    interval_s = parse_duration(whatif.interval)
    span_s = horizon_s if horizon_s is not None else 0.0
    return ScenarioSize(
        nodes=nodes + added,
        gpus=gpus + added_gpus,
        jobs_per_run=jobs,
        runs=whatif.runs,
        intervals=math.ceil(span_s / interval_s) if interval_s > 0 else 0,
    )


def paired_difference(baseline: list[float], scenario: list[float]) -> dict[str, Any]:
    """Scenario minus baseline, run by run: mean, p10/p90 of the differences, 95 % CI of the mean."""
    b = np.asarray(baseline, dtype=float)
    s = np.asarray(scenario, dtype=float)
    d = s - b
    d = d[~np.isnan(d)]
    out: dict[str, Any] = dict(spread(d))
    if len(d) >= 2 and np.ptp(d) > 0:
        half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    else:
        half = 0.0  # identical differences in every run (e.g. all zero): no spread to report
    mean = out["mean"]
    out["ci95"] = None if mean is None else [mean - half, mean + half]
    return out


def compare(baseline: list[RunOutput], scenario: list[RunOutput], slos: SloSet) -> dict[str, Any]:
    diff: dict[str, Any] = {
        k: paired_difference([o.summary[k] for o in baseline], [o.summary[k] for o in scenario])
        for k in SUMMARY_FIGURES
    }
    slo_diff = []
    for k, slo in enumerate(slos.slos):
        slo_diff.append(
            {
                "name": slo.name,
                "metric": slo.metric,
                "attainment": paired_difference(
                    [o.slos[k]["attainment"] for o in baseline], [o.slos[k]["attainment"] for o in scenario]
                ),
                "probability_met": float(
                    np.mean([o.slos[k]["met"] for o in scenario])
                    - np.mean([o.slos[k]["met"] for o in baseline])
                ),
            }
        )
    diff["slos"] = slo_diff
    return diff


def run_whatif(
    inputs: TwinInputs,
    models: JobModels | None,
    whatif: WhatIf,
    slos: SloSet = DEFAULT_SLOS,
    *,
    workers: int | None = None,
    model_source: str = "calibrated",
    progress: Callable[[], object] | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Baseline and scenario ensembles (`progress` is called once per finished run of either), on Ray when
    `ray_address` is given."""
    began = time.perf_counter()
    options = whatif.baseline_options(workers, ray_address)
    scenario_inputs, scenario_options = apply_changes(inputs, options, whatif.changes)
    baseline_spec = make_spec(inputs, models, options, slos)
    scenario_spec = make_spec(scenario_inputs, models, scenario_options, slos, known=baseline_spec.catalog)
    baseline = run_ensemble(baseline_spec, options.runs, workers, progress, ray_address=ray_address)
    scenario = run_ensemble(scenario_spec, options.runs, workers, progress, ray_address=ray_address)
    return json_safe(
        {
            "name": whatif.name,
            "changes": whatif.changes.model_dump(mode="json", exclude_defaults=True),
            "baseline": describe(inputs, options, model_source) | summarize(baseline, slos),
            "scenario": describe(scenario_inputs, scenario_options, model_source) | summarize(scenario, slos),
            "difference": compare(baseline, scenario, slos),
            "notes": scenario_notes(inputs, whatif.changes),
            "wall_s": round(time.perf_counter() - began, 3),
        }
    )
