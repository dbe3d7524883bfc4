"""Ensembles of seeded runs, and their spread.

Run i of an ensemble with seed s uses `numpy.random.default_rng([s, i])`: one child stream samples the
future arrivals, the other gives the run key from which every job draws its own numbers. So run i is the
same whichever process runs it, and a what-if's run i pairs with the baseline's run i (common random
numbers). Runs spread over processes (both cores) when the ensemble is big enough to pay for starting them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from twin.arrivals import ArrivalModel
from twin.cluster import Cluster
from twin.executors import Executor, TaskFailure, worker_pool
from twin.plan import JobPlan, PreparedCatalog, build_plan
from twin.policies import DEFAULT_BACKFILL_DEPTH, Policy
from twin.randomness import run_key
from twin.run_metrics import SERIES_FIGURES, SUMMARY_FIGURES, energy_if_run, measure
from twin.simulator import End, SimResult, simulate
from twin.slo_attainment import DEFAULT_SLOS, SloSet, evaluate
from twin.workload import Workload, concat

# Runs per Ray task: a task costs a few milliseconds of scheduling, a run tens to hundreds.
RAY_CHUNK_RUNS = 4
# Below this many simulated jobs in the whole ensemble, starting worker processes costs more than it saves.
PARALLEL_MIN_JOBS = 40_000


@dataclass
class EnsembleSpec:
    """Everything one run needs, prepared once (models already asked): picklable, sent once per worker."""

    cluster: Cluster
    workload: Workload  # the jobs known at time 0
    catalog: PreparedCatalog  # predictions for workload.catalog (+ the arrival mix's, appended)
    arrivals: ArrivalModel | None = None
    failure_times_s: np.ndarray | None = None
    policy: Policy = Policy.FIFO
    horizon_s: float | None = None  # None: run until every job has ended
    interval_s: float = 3600.0
    seed: int = 0
    slos: SloSet = field(default_factory=lambda: DEFAULT_SLOS)
    backfill_depth: int = DEFAULT_BACKFILL_DEPTH
    keep_jobs: bool = False  # keep run 0's job table
    # Backtests: also the energy these jobs would draw if they ran to completion (summary
    # `energy_kwh_if_run`): the jobs whose truth is measured, which are the ones that completed.
    energy_jobs: frozenset[str] | None = None


@dataclass
class RunOutput:
    summary: dict[str, float]
    utilization_by_type: dict[str, float]
    edges_s: np.ndarray
    series: dict[str, np.ndarray]
    utilization_by_type_series: dict[str, np.ndarray]
    slos: list[dict[str, Any]]
    jobs: list[dict[str, object]] | None = None


def run_workload(spec: EnsembleSpec, rng: np.random.Generator) -> Workload:
    """The known jobs plus this run's future arrivals (drawn with `rng`)."""
    if spec.arrivals is None or spec.horizon_s is None:
        return spec.workload
    return concat([spec.workload, spec.arrivals.sample(rng, spec.horizon_s)])


def run_streams(seed: int, index: int) -> tuple[np.random.Generator, np.random.Generator]:
    """Run `index`'s two independent streams: future arrivals, and the key of the per-job draws."""
    arrivals_rng, key_rng = np.random.default_rng([seed, index]).spawn(2)
    return arrivals_rng, key_rng


def run_one(spec: EnsembleSpec, index: int) -> RunOutput:
    arrivals_rng, key_rng = run_streams(spec.seed, index)
    workload = run_workload(spec, arrivals_rng)
    plan = build_plan(workload, spec.catalog, spec.cluster, run_key(key_rng), spec.failure_times_s)
    result = simulate(
        spec.cluster,
        plan,
        spec.policy,
        spec.horizon_s,
        env=simpy.Environment(),
        backfill_depth=spec.backfill_depth,
    )
    metrics = measure(plan, result, spec.cluster.gpus_by_model(), spec.horizon_s, spec.interval_s)
    if spec.energy_jobs is not None:
        subset = np.fromiter((j in spec.energy_jobs for j in plan.job_ids), dtype=bool, count=len(plan))
        metrics.summary["energy_kwh_if_run"] = energy_if_run(plan, subset)
    return RunOutput(
        summary=metrics.summary,
        utilization_by_type=metrics.utilization_by_type,
        edges_s=metrics.edges_s,
        series=metrics.series,
        utilization_by_type_series=metrics.utilization_by_type_series,
        slos=evaluate(spec.slos, metrics),
        jobs=job_table(plan, result) if spec.keep_jobs and index == 0 else None,
    )


def job_table(plan: JobPlan, result: SimResult) -> list[dict[str, object]]:
    """Per job (arrival order): id, wait (s), end time (s), outcome (completed, failed, rejected, running,
    queued). Times are seconds from the simulation's start; None where there is none."""
    rows: list[dict[str, object]] = []
    for i, job_id in enumerate(plan.job_ids):
        start, end = float(result.start_s[i]), float(result.end_s[i])
        code = End(int(result.outcome[i]))
        pending = "running" if not math.isnan(start) else "queued"
        label = pending if code is End.PENDING else code.label
        if code is End.REJECTED:
            wait: float | None = 0.0
        else:
            wait = None if math.isnan(start) else max(start - float(plan.arrival_s[i]), 0.0)
        rows.append(
            {"job_id": job_id, "wait_s": wait, "end_s": None if math.isnan(end) else end, "outcome": label}
        )
    return rows


_WORKER_SPEC: EnsembleSpec | None = None


def _init_worker(spec: EnsembleSpec) -> None:
    global _WORKER_SPEC
    _WORKER_SPEC = spec


def _run_in_worker(index: int) -> RunOutput:
    assert _WORKER_SPEC is not None
    return run_one(_WORKER_SPEC, index)


def default_workers(spec: EnsembleSpec, runs: int) -> int:
    jobs = len(spec.workload)
    if spec.arrivals is not None and spec.horizon_s is not None:
        jobs += int(spec.arrivals.daily_jobs * spec.horizon_s / 86400.0)
    if runs < 2 or jobs * runs < PARALLEL_MIN_JOBS:
        return 1
    return max(1, min(os.cpu_count() or 1, runs))


def _run_chunk(spec: EnsembleSpec, chunk: tuple[int, int]) -> list[RunOutput]:
    return [run_one(spec, index) for index in range(*chunk)]


def _per_run(
    progress: Callable[[], object] | None, runs_per_task: int, runs: int
) -> Callable[[int, int], None] | None:
    """An executor's progress (tasks finished, tasks in all) as `progress()` once per finished run, for
    tasks of `runs_per_task` runs each and `runs` runs in all."""
    if progress is None:
        return None
    reported = 0

    def done(finished: int, _total: int) -> None:
        nonlocal reported
        while reported < min(finished * runs_per_task, runs):
            reported += 1
            progress()

    return done


def run_on_ray(
    spec: EnsembleSpec, runs: int, address: str, progress: Callable[[], object] | None = None
) -> list[RunOutput]:
    """Runs 0..runs-1 as Ray tasks of RAY_CHUNK_RUNS runs each; the spec goes to the object store once.
    The same outputs as a local ensemble: run i is run i wherever it runs."""
    from twin.executors import RayExecutor

    chunks = [(first, min(first + RAY_CHUNK_RUNS, runs)) for first in range(0, runs, RAY_CHUNK_RUNS)]
    # Per run, as the local pool reports (chunks finish in any order).
    done = _per_run(progress, RAY_CHUNK_RUNS, runs)
    results = RayExecutor(address).run(_run_chunk, spec, chunks, progress=done)
    outputs: list[RunOutput] = []
    for (first, stop), result in zip(chunks, results, strict=True):
        if isinstance(result, TaskFailure):
            raise RuntimeError(
                f"runs {first}..{stop - 1} failed on Ray ({result.attempts} attempts): {result.error}"
            )
        outputs.extend(result)
    return outputs


def run_ensemble(
    spec: EnsembleSpec,
    runs: int,
    workers: int | None = None,
    progress: Callable[[], object] | None = None,
    *,
    ray_address: str | None = None,
) -> list[RunOutput]:
    """Runs 0..runs-1, in order; the same outputs whatever the number of worker processes, and on a Ray
    cluster when `ray_address` is given. `progress` is called once per finished run (a progress bar); an
    exception it raises stops a local ensemble, after the runs in flight, and propagates."""
    if runs < 1:
        raise ValueError("an ensemble needs at least one run")
    if ray_address:
        return run_on_ray(spec, runs, ray_address, progress)
    workers = default_workers(spec, runs) if workers is None else max(1, min(workers, runs))
    outputs: list[RunOutput] = []
    if workers == 1:
        for i in range(runs):
            outputs.append(run_one(spec, i))
            if progress is not None:
                progress()
        return outputs
    with worker_pool(workers, _init_worker, (spec,), preload=[__name__]) as pool:
        try:
            for output in pool.map(_run_in_worker, range(runs)):
                outputs.append(output)
                if progress is not None:
                    progress()
        except BaseException:
            # `progress` may raise to stop the ensemble (the API's client left): the runs not started are
            # dropped instead of being waited for when the pool closes.
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    return outputs


def _figures_of_runs(_shared: None, task: tuple[EnsembleSpec, int]) -> list[RunOutput]:
    """Runs 0..runs-1 of one spec, without their series (what a paired comparison reads: the summary,
    per-type utilization and SLOs), so that what a worker sends back stays small."""
    spec, runs = task
    empty = np.empty(0)
    return [
        RunOutput(output.summary, output.utilization_by_type, empty, {}, {}, output.slos)
        for output in (run_one(spec, index) for index in range(runs))
    ]


def run_ensembles(
    specs: Sequence[EnsembleSpec], runs: int, executor: Executor, progress: Callable[[], object] | None = None
) -> list[list[RunOutput]]:
    """Runs 0..runs-1 of every spec on `executor`, one pool for them all (an ensemble each would start a
    pool each). Per spec, its runs in order, as `run_ensemble` makes them but without their series. A task
    is one spec's runs: each spec is pickled on its own, a few milliseconds each, where all of them at once
    (a worker's shared inputs) held the interpreter from the caller's other threads for tens. `progress` is
    called once per finished run; an exception it raises stops the batch and propagates, as does a spec
    whose runs fail on every attempt."""
    if runs < 1:
        raise ValueError("an ensemble needs at least one run")
    done = _per_run(progress, runs, runs * len(specs))
    outputs = executor.run(_figures_of_runs, None, [(spec, runs) for spec in specs], progress=done)
    for k, output in enumerate(outputs):
        if isinstance(output, TaskFailure):
            raise RuntimeError(f"the runs of ensemble {k} failed, {output.attempts} times: {output.error}")
    return outputs


def spread(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """Mean, p10 and p90 across runs (NaN runs left out; None when no run has a value).

    p10-p90 is the interval that holds one more run with 80 % chance, which is what the truth is to the
    ensemble: the runs' order statistics at p (n + 1) (Weibull's plotting positions). The runs' own
    interpolated percentiles are narrower: with 16 runs they hold another run 71 % of the time, with 8 64 %.
    Below 9 runs the interval is the runs' range, which holds another run (n - 1) / (n + 1) of the time."""
    array = np.asarray(values, dtype=float)
    array = array[~np.isnan(array)]
    if not len(array):
        return {"mean": None, "p10": None, "p90": None}
    p10, p90 = np.quantile(array, [0.1, 0.9], method="weibull")
    return {"mean": float(array.mean()), "p10": float(p10), "p90": float(p90)}


def relative_error(value: float | None, truth: float) -> float | None:
    """(value - truth) / truth; None without a value or where the truth is 0."""
    return None if value is None or truth == 0 else (value - truth) / truth


def spread_series(rows: Sequence[np.ndarray]) -> dict[str, list[float | None]]:
    """Per interval, the spread across runs (`spread`). Runs without a horizon end at different times: a
    run that has ended has no value in the later intervals (NaN, left out), nor has a run an interval's wait
    where no job started in it.

    The intervals are reduced together, those with the same number of runs with a value at once, each
    along its own contiguous row of those values in the runs' order: `spread`'s floats exactly
    (tests/twin/test_spread.py). A `spread` per interval cost 64 us: 97 of a 113 s forecast of 86,400
    one-second intervals (`bench/ensemble_summary.py`)."""
    width = max(len(r) for r in rows)
    stack = np.full((width, len(rows)), np.nan)  # an interval a row
    for i, r in enumerate(rows):
        stack[: len(r), i] = r
    valid = ~np.isnan(stack)
    counts = valid.sum(axis=1)
    if not valid.all():  # each interval's values first, in the runs' order (the mean's sum is in that order)
        stack = np.take_along_axis(stack, np.argsort(~valid, axis=1, kind="stable"), axis=1)
    mean, p10, p90 = np.full(width, np.nan), np.full(width, np.nan), np.full(width, np.nan)
    for n in np.unique(counts[counts > 0]):
        same = np.flatnonzero(counts == n)
        values = np.ascontiguousarray(stack[same, :n])
        mean[same] = values.mean(axis=1)
        p10[same], p90[same] = np.quantile(values, [0.1, 0.9], axis=1, method="weibull")
    out: dict[str, list[float | None]] = {"mean": mean.tolist(), "p10": p10.tolist(), "p90": p90.tolist()}
    for j in np.flatnonzero(counts == 0):
        for k in out:
            out[k][j] = None
    return out


def summarize(outputs: Sequence[RunOutput], slos: SloSet) -> dict[str, object]:
    """The ensemble as JSON-ready figures: `summary`, `series` and `slos`, each figure as mean/p10/p90."""
    first = outputs[0]
    edges = max((o.edges_s for o in outputs), key=len)
    summary: dict[str, object] = {k: spread([o.summary[k] for o in outputs]) for k in SUMMARY_FIGURES}
    summary["utilization_by_type"] = {
        name: spread([o.utilization_by_type.get(name, math.nan) for o in outputs])
        for name in first.utilization_by_type
    }
    series: dict[str, object] = {"t_s": edges[:-1].tolist(), "interval_end_s": edges[1:].tolist()}
    for name in SERIES_FIGURES:
        series[name] = spread_series([o.series[name] for o in outputs])
    # Per interval, the share of runs in which each SLO held (its mean; p10/p90 show whether runs agree).
    series["slo_attainment"] = {
        slo.name: spread_series([np.asarray(o.slos[k]["held"], dtype=float) for o in outputs])
        for k, slo in enumerate(slos.slos)
    }
    series["utilization_by_type"] = {
        name: spread_series([o.utilization_by_type_series[name] for o in outputs])
        for name in first.utilization_by_type_series
    }
    slo_out = []
    for k, slo in enumerate(slos.slos):
        slo_out.append(
            {
                **slo.model_dump(exclude_none=True),
                "value": spread([o.slos[k]["value"] for o in outputs]),
                "attainment": spread([o.slos[k]["attainment"] for o in outputs]),
                "probability_met": float(np.mean([o.slos[k]["met"] for o in outputs])),
            }
        )
    return {"summary": summary, "series": series, "slos": slo_out}
