"""Capacity planning: the cheapest cluster (and policy) that meets the SLOs for a workload.

A sweep varies the number of nodes of some GPU types over ranges, the scheduling policy and the admission
control; every combination is a scenario. Each scenario runs the same seeded runs as a forecast
(`twin.ensemble.run_one`): run i of every scenario has run i's arrivals and per-job draws (common random
numbers), so two scenarios differ by their cluster and policy, not by luck.

A scenario meets the SLOs when each SLO holds over the window in at least `confidence` of its runs, and
every job can be placed on it (a cluster without a job's GPU type would "meet" a wait SLO by turning the
job away). The cheapest such scenario has the fewest provisioned GPU-hours per day, ties broken by
simulated energy per day. The frontier is the scenarios no other one beats on both cost (GPU-hours, then
energy) and the share of runs in which the weakest SLO holds.

Work is split into tasks of one scenario x a chunk of runs, run by an executor (`twin.executors`): the
local pool or Ray. The models are asked here, once per admission setting, before anything fans out; tasks
get the predictions, never the models. Tasks and chunks do not depend on the executor, and results are
assembled in run order, so the answer is the same bytes whichever executor ran it.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator, model_validator

from twin.arrivals import ArrivalModel
from twin.cluster import Cluster, NodeSpec
from twin.config_changes import Admission
from twin.domain import GPUS_PER_NODE, known_gpu_name
from twin.ensemble import EnsembleSpec, run_one, spread
from twin.executors import Executor, Progress, TaskFailure
from twin.forecast import TwinInputs, catalog_of, models_for
from twin.jsonsafe import json_safe
from twin.limits import MAX_ENSEMBLE_RUNS, interval_problem, simulated_duration
from twin.plan import PlanOptions, PreparedCatalog, Reject, pool_index, prepare_catalog
from twin.policies import DEFAULT_BACKFILL_DEPTH, Policy
from twin.protocols import JobModels
from twin.slo_attainment import SloSet
from twin.units import parse_duration
from twin.workload import NO_CONFIG, Workload

_Duration = Annotated[str, Field(min_length=1, max_length=32)]  # `24h`, `90m`
MAX_SCENARIOS = 5000
DEFAULT_CHUNK_RUNS = 8  # runs per task: small enough to spread 24 scenarios over many workers
MAX_VARY_NODES = 100_000
_VARY = re.compile(r"^\s*(?P<gpu>.+?)\s*=\s*(?P<low>\d+)\s*(?:\.\.\s*(?P<high>\d+))?\s*$")


class SweepError(ValueError):
    """A sweep that cannot be set up (bad ranges, too many scenarios); the message says what to change."""


class VaryRange(BaseModel):
    """Nodes of one GPU type, from `min` to `max` (inclusive). Also written `NAME=MIN..MAX` or `NAME=N`."""

    model_config = ConfigDict(extra="forbid")

    gpu_model: str = Field(min_length=1, max_length=100)
    min: StrictInt = Field(ge=0, le=MAX_VARY_NODES)
    max: StrictInt = Field(ge=0, le=MAX_VARY_NODES)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _VARY.match(value)
            if match is None:
                raise ValueError(f"expected GPU=MIN..MAX (e.g. NVIDIA-A100-SXM4-80GB=1..6), got {value!r}")
            low, high = match["low"], match["high"] or match["low"]
            digits = max(len(low), len(high))
            if digits > len(str(MAX_VARY_NODES)):  # said before int(), which refuses 4,300 digits and more
                raise ValueError(
                    f"at most {MAX_VARY_NODES:,} nodes of a type; {match['gpu']}'s is {digits:,} digits long"
                )
            return {"gpu_model": match["gpu"], "min": int(low), "max": int(high)}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> VaryRange:
        if self.min > self.max:
            raise ValueError(f"{self.gpu_model}: the range {self.min}..{self.max} is empty")
        # As a cluster file's and a what-if's: a misspelled type was planned as a phantom pool no job asks
        # for, and the plan read "no scenario meets the SLOs".
        self.gpu_model = known_gpu_name(self.gpu_model)
        return self

    def counts(self) -> range:
        return range(self.min, self.max + 1)


class SweepRequest(BaseModel):
    """What to sweep and how sure to be. `horizon` None: until every known job has ended."""

    model_config = ConfigDict(extra="forbid")

    vary: list[VaryRange] = Field(min_length=1, max_length=10)
    policies: list[Policy] = Field(default_factory=lambda: [Policy.FIFO], min_length=1)
    admissions: list[Admission] = Field(default_factory=lambda: [Admission.OFF], min_length=1)
    # Strict: `true` is not a count, `"4"` not a number (the API's bodies and the CLI's files alike).
    runs: StrictInt = Field(default=16, ge=1, le=MAX_ENSEMBLE_RUNS)
    seed: StrictInt = Field(default=0, ge=0, le=2**63 - 1)
    confidence: StrictFloat = Field(default=0.9, gt=0.0, le=1.0)
    horizon: _Duration | StrictFloat | None = "24h"
    interval: _Duration | StrictFloat = "1h"
    chunk_runs: StrictInt = Field(default=DEFAULT_CHUNK_RUNS, ge=1, le=MAX_ENSEMBLE_RUNS)

    @field_validator("policies", "admissions")
    @classmethod
    def _distinct(cls, values: list[Any]) -> list[Any]:
        return list(dict.fromkeys(values))  # "fifo,fifo" is one policy, not two identical scenarios

    @field_validator("vary")
    @classmethod
    def _one_range_per_type(cls, values: list[VaryRange]) -> list[VaryRange]:
        seen = [v.gpu_model for v in values]
        for name in seen:
            if seen.count(name) > 1:
                raise ValueError(f"{name} is varied twice")
        return values

    @field_validator("horizon", "interval")
    @classmethod
    def _duration(cls, value: str | float | None) -> str | float | None:
        if value is not None:
            simulated_duration(value)  # raises ValueError with the offending text
        return value

    @model_validator(mode="after")
    def _interval_within_horizon(self) -> SweepRequest:
        problem = interval_problem(self.horizon, self.interval)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def horizon_s(self) -> float | None:
        return None if self.horizon is None else parse_duration(self.horizon)

    @property
    def interval_s(self) -> float:
        return parse_duration(self.interval)


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[tuple[str, int], ...]  # (GPU type, nodes), every type of the scenario, sorted by name
    policy: Policy
    admission: Admission
    gpus: int  # GPUs in the cluster (its cost: this many GPU-hours per hour)

    def label(self) -> str:
        nodes = ", ".join(f"{gpu}={count}" for gpu, count in self.nodes)
        return f"{nodes}; {self.policy.value}; admission {self.admission.value}"


def gpus_per_node(base: Cluster, gpu_model: str) -> int:
    """A new node of a type looks like the base cluster's nodes of that type (8 GPUs when it has none)."""
    sizes = [n.gpus for n in base.nodes if n.gpu_model == gpu_model]
    return sizes[0] if sizes else GPUS_PER_NODE


def scenario_cluster(base: Cluster, nodes: tuple[tuple[str, int], ...]) -> Cluster:
    """The base cluster with the varied types' nodes set to the scenario's counts."""
    counts = dict(nodes)
    kept = [n for n in base.nodes if n.gpu_model not in counts]
    kept_counts: dict[str, int] = {}
    for node in kept:
        kept_counts[node.gpu_model] = kept_counts.get(node.gpu_model, 0) + 1
    varied = [
        NodeSpec(f"{gpu}-{k}", gpu, gpus_per_node(base, gpu))
        for gpu, count in nodes
        if gpu not in kept_counts
        for k in range(count)
    ]
    return Cluster(tuple(kept) + tuple(varied))


def enumerate_scenarios(base: Cluster, request: SweepRequest) -> list[Scenario]:
    """Every combination, in a fixed order: node counts (first range slowest), then policy, admission.
    Combinations without a single node are left out."""
    fixed: dict[str, int] = {}
    varied = {v.gpu_model for v in request.vary}
    for node in base.nodes:
        if node.gpu_model not in varied:
            fixed[node.gpu_model] = fixed.get(node.gpu_model, 0) + 1
    count = math.prod(len(v.counts()) for v in request.vary) * len(request.policies) * len(request.admissions)
    if count > MAX_SCENARIOS:
        raise SweepError(f"{count} scenarios is more than {MAX_SCENARIOS}: narrow the ranges")
    out: list[Scenario] = []
    for counts in itertools.product(*(v.counts() for v in request.vary)):
        nodes = dict(fixed) | {v.gpu_model: c for v, c in zip(request.vary, counts, strict=True)}
        if not any(nodes.values()):
            continue
        gpus = sum(n.gpus for n in base.nodes if n.gpu_model not in varied) + sum(
            c * gpus_per_node(base, v.gpu_model) for v, c in zip(request.vary, counts, strict=True)
        )
        for policy in request.policies:
            for admission in request.admissions:
                out.append(Scenario(tuple(sorted(nodes.items())), Policy(policy), Admission(admission), gpus))
    if not out:
        raise SweepError("every combination of the ranges has no node at all")
    return out


@dataclass(frozen=True)
class SweepSize:
    """How big a sweep is before it runs: its scenarios, the largest one's cluster, and its simulated work."""

    scenarios: int
    nodes: int  # of the largest scenario
    gpus: int  # of the largest scenario
    jobs_per_run: int  # known jobs plus the arrivals expected over the horizon
    runs: int  # of each scenario
    task_runs: int  # of each task (a scenario's runs are simulated a chunk at a time)
    intervals: int  # steps of each run's series (none without a horizon)

    @property
    def job_runs(self) -> int:
        """Jobs simulated in all: every scenario, every run."""
        return self.scenarios * self.runs * self.jobs_per_run

    @property
    def task_job_runs(self) -> int:
        """Jobs simulated by one task: what a worker may be in the middle of when it is asked to stop."""
        return self.task_runs * self.jobs_per_run


def sweep_size(inputs: TwinInputs, request: SweepRequest, scenarios: Sequence[Scenario]) -> SweepSize:
    """Counted from the request and the live state alone (no simulation), so that a sweep too big to run
    can be refused at once."""
    horizon_s = request.horizon_s
    jobs = len(inputs.workload)
    if horizon_s is not None and inputs.arrivals is not None:
        jobs += math.ceil(inputs.arrivals.daily_jobs * horizon_s / 86400.0)
    return SweepSize(
        scenarios=len(scenarios),
        nodes=max((sum(count for _, count in s.nodes) for s in scenarios), default=0),
        gpus=max((s.gpus for s in scenarios), default=0),
        jobs_per_run=jobs,
        runs=request.runs,
        task_runs=min(request.runs, request.chunk_runs),
        intervals=math.ceil(horizon_s / request.interval_s) if horizon_s is not None else 0,
    )


@dataclass
class SweepInputs:
    """What every task reads, the same for all scenarios: put in Ray's object store (or sent to each pool
    worker) once. The models' predictions are here, one catalog per admission setting; not the models."""

    base: Cluster
    workload: Workload
    arrivals: ArrivalModel | None
    failure_times_s: np.ndarray | None
    catalogs: dict[str, PreparedCatalog]
    horizon_s: float | None
    interval_s: float
    seed: int
    slos: SloSet
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH


@dataclass(frozen=True)
class SweepTask:
    """One scenario x runs [first, stop): small, it travels with every task."""

    scenario: int
    nodes: tuple[tuple[str, int], ...]
    policy: Policy
    admission: Admission
    first: int
    stop: int


@dataclass(frozen=True)
class RunFigures:
    """What one run of a scenario contributes to the answer (a task returns a few of these, not series)."""

    attainment: tuple[float, ...]  # per SLO: fraction of intervals in which it held
    met: tuple[float, ...]  # per SLO: 1 when it held over the whole window
    energy_kwh: float
    window_s: float


def scenario_spec(shared: SweepInputs, task: SweepTask) -> EnsembleSpec:
    return EnsembleSpec(
        cluster=scenario_cluster(shared.base, task.nodes),
        workload=shared.workload,
        catalog=shared.catalogs[task.admission.value],
        arrivals=shared.arrivals if shared.horizon_s is not None else None,
        failure_times_s=shared.failure_times_s,
        policy=task.policy,
        horizon_s=shared.horizon_s,
        interval_s=shared.interval_s,
        seed=shared.seed,
        slos=shared.slos,
        backfill_depth=shared.backfill_depth,
    )


def run_sweep_task(shared: SweepInputs, task: SweepTask) -> list[RunFigures]:
    """Runs `first..stop-1` of one scenario: the same runs a forecast of that cluster would make."""
    spec = scenario_spec(shared, task)
    out = []
    for index in range(task.first, task.stop):
        run = run_one(spec, index)
        out.append(
            RunFigures(
                attainment=tuple(float(s["attainment"]) for s in run.slos),
                met=tuple(float(s["met"]) for s in run.slos),
                energy_kwh=float(run.summary["energy_kwh"]),
                window_s=float(run.edges_s[-1]),
            )
        )
    return out


def make_tasks(scenarios: Sequence[Scenario], runs: int, chunk_runs: int) -> list[SweepTask]:
    return [
        SweepTask(k, s.nodes, s.policy, s.admission, first, min(first + chunk_runs, runs))
        for k, s in enumerate(scenarios)
        for first in range(0, runs, chunk_runs)
    ]


def prepare_inputs(
    inputs: TwinInputs, models: JobModels | None, request: SweepRequest, slos: SloSet
) -> SweepInputs:
    """A catalog per admission setting (the only thing a scenario changes about the jobs); the models are
    asked about each configuration once, whichever settings keep it."""
    horizon = request.horizon_s
    if horizon is not None and horizon <= 0:
        raise SweepError("the horizon must be positive")
    if horizon is None and inputs.arrivals is not None and not len(inputs.workload):
        raise SweepError("the live arrival process needs a horizon (e.g. 24h)")
    configs, models = catalog_of(inputs), models_for(inputs, models)
    catalogs: dict[str, PreparedCatalog] = {}
    known = None
    for admission in request.admissions:
        known = catalogs[admission.value] = prepare_catalog(configs, models, PlanOptions(admission), known)
    return SweepInputs(
        base=inputs.cluster,
        workload=inputs.workload,
        arrivals=inputs.arrivals if horizon is not None else None,
        failure_times_s=inputs.failure_times_s,
        catalogs=catalogs,
        horizon_s=horizon,
        interval_s=request.interval_s,
        seed=request.seed,
        slos=slos,
    )


def unplaceable_share(shared: SweepInputs, scenario: Scenario) -> float:
    """The share of the jobs (known ones and the arrival mix) that no node of the scenario can hold:
    their GPU type is missing or they need more GPUs than it has. Rule-breaking jobs do not count (they are
    rejected whatever the cluster)."""
    cluster = scenario_cluster(shared.base, scenario.nodes)
    catalog = shared.catalogs[scenario.admission.value]
    parts = [shared.workload] + ([shared.arrivals.mix] if shared.arrivals is not None else [])
    offset = 0
    total = bad = 0
    for part in parts:
        if len(part):
            _, _, fits = pool_index(part, cluster)
            has_cfg = part.config_idx != NO_CONFIG
            ruled = np.zeros(len(part), dtype=bool)
            ruled[has_cfg] = catalog.reject[part.config_idx[has_cfg] + offset] != Reject.NONE
            total += int((~ruled).sum())
            bad += int((~fits & ~ruled).sum())
        offset += len(part.catalog)
    return bad / total if total else 0.0


def summarize_scenario(
    scenario: Scenario, runs: list[RunFigures], slos: SloSet, confidence: float, unplaceable: float
) -> dict[str, Any]:
    per_slo: dict[str, Any] = {}
    meets = unplaceable == 0.0
    for k, slo in enumerate(slos.slos):
        met_share = float(np.mean([r.met[k] for r in runs]))
        per_slo[slo.name] = {"attainment": spread([r.attainment[k] for r in runs]), "met_share": met_share}
        meets = meets and met_share >= confidence - 1e-12
    energy = [r.energy_kwh * 86400.0 / r.window_s if r.window_s > 0 else 0.0 for r in runs]
    return {
        "nodes": dict(scenario.nodes),
        "policy": scenario.policy.value,
        "admission": scenario.admission.value,
        "slos": per_slo,
        "meets_slos": bool(meets),
        "gpu_hours_per_day": float(scenario.gpus * 24),
        "energy_kwh_per_day": float(np.mean(energy)),
        "unplaceable_share": unplaceable,
    }


def weakest_met_share(row: dict[str, Any]) -> float:
    """The share of runs in which the weakest SLO held (1 when there are no SLOs). A failed scenario, or
    one that cannot place every job, scores 0: like `meets_slos`, it does not serve the workload."""
    if "error" in row or row.get("unplaceable_share"):
        return 0.0
    shares = [s["met_share"] for s in row["slos"].values()]
    return min(shares) if shares else 1.0


def mark_frontier(rows: list[dict[str, Any]]) -> None:
    """`frontier` is true for each scenario that no other beats: at most its cost (GPU-hours, then energy)
    and at least its weakest SLO's met share, better in one. Failed scenarios are never on it, nor those
    that cannot place every job: they do not serve the workload, and one such, the cheapest of all, was
    starred as a trade-off worth having."""
    points = [
        (r["gpu_hours_per_day"], r["energy_kwh_per_day"], weakest_met_share(r))
        if "error" not in r and not r.get("unplaceable_share")
        else None
        for r in rows
    ]
    for r, p in zip(rows, points, strict=True):
        if p is None:
            r["frontier"] = False
            continue
        cost, score = (p[0], p[1]), p[2]
        r["frontier"] = not any(
            q is not None and (q[0], q[1]) <= cost and q[2] >= score and ((q[0], q[1]) < cost or q[2] > score)
            for q in points
        )


def cheapest(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    meeting = [r for r in rows if r["meets_slos"]]
    if not meeting:
        return None
    return min(meeting, key=lambda r: (r["gpu_hours_per_day"], r["energy_kwh_per_day"]))


SweepTaskFn = Callable[[SweepInputs, SweepTask], list[RunFigures]]


def run_sweep(
    inputs: TwinInputs,
    models: JobModels | None,
    request: SweepRequest,
    slos: SloSet,
    executor: Executor,
    *,
    progress: Progress | None = None,
    task_fn: SweepTaskFn = run_sweep_task,
) -> dict[str, Any]:
    """The sweep as a JSON-ready dict: executor, tasks, every scenario's figures (frontier marked), the
    cheapest scenario that meets the SLOs (or None), and the scenarios whose tasks failed."""
    began = time.perf_counter()
    scenarios = enumerate_scenarios(inputs.cluster, request)
    shared = prepare_inputs(inputs, models, request, slos)
    tasks = make_tasks(scenarios, request.runs, request.chunk_runs)
    results = executor.run(task_fn, shared, tasks, progress=progress)

    runs: list[list[RunFigures]] = [[] for _ in scenarios]
    errors: dict[int, str] = {}
    for task, result in zip(tasks, results, strict=True):
        if isinstance(result, TaskFailure):
            errors.setdefault(
                task.scenario,
                f"runs {task.first}..{task.stop - 1} failed {result.attempts} times: {result.error}",
            )
        else:
            runs[task.scenario].extend(result)  # tasks are in run order within a scenario

    rows: list[dict[str, Any]] = []
    for k, scenario in enumerate(scenarios):
        if k in errors:
            rows.append(
                {
                    "nodes": dict(scenario.nodes),
                    "policy": scenario.policy.value,
                    "admission": scenario.admission.value,
                    "slos": {},
                    "meets_slos": False,
                    "gpu_hours_per_day": float(scenario.gpus * 24),
                    "energy_kwh_per_day": None,
                    "unplaceable_share": None,
                    "error": errors[k],
                }
            )
        else:
            unplaceable = unplaceable_share(shared, scenario)
            rows.append(summarize_scenario(scenario, runs[k], slos, request.confidence, unplaceable))
    mark_frontier(rows)
    best = cheapest(rows)
    return json_safe(
        {
            "executor": executor.name,
            "tasks": len(tasks),
            "runs": request.runs,
            "seed": request.seed,
            "confidence": request.confidence,
            "horizon_s": request.horizon_s,
            "slos": [s.name for s in slos.slos],
            "scenarios": rows,
            "cheapest": best,
            "failed": [
                {"scenario": k, "label": scenarios[k].label(), "error": errors[k]} for k in sorted(errors)
            ],
            "wall_s": round(time.perf_counter() - began, 3),
        }
    )


def without_timings(document: dict[str, Any]) -> dict[str, Any]:
    """The sweep's answer without what legitimately differs between executors (for comparisons)."""
    return {k: v for k, v in document.items() if k not in ("executor", "wall_s")}
