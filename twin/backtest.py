"""Backtest: replay what happened, start the twin at a window's start, compare its forecast with it.

"What happened" is a benchmark workload with arrival times: every row of an LLMFineTuningBench file is one
job, arriving in a seeded random order by a Poisson process whose rate offers the cluster a chosen load.
A valid row holds its GPUs for its measured `train_runtime`; a row that failed at runtime holds them until
it fails (the benchmark does not say when: a draw from the same failure-time distribution the twin uses);
a rejected row never runs. Replayed with the scheduling policy, that is the truth.

The twin sees what live telemetry would show at the window's start (the jobs queued, the jobs running
with their progress, measured rate and power) and the jobs that arrive in the window, with their configuration
and work (dataset tokens) but not their outcome or run time: those come from the models. Both are run to
completion and compared on the window's jobs: jobs completed, GPU-hours (from the window's start), mean
wait, makespan, and energy: over the jobs whose rows carry measured power, their measured power per GPU
times their GPUs and run time, against what the twin says those jobs draw if they run to completion.

Only valid runs carry measured power, so the energy figure is over jobs chosen by their outcome. The twin's
figure for them is conditional on that outcome: each job's drawn run, also in a run of the ensemble where it
drew a failure. Counting what the twin's runs burn instead would charge the failure model's doubts about
jobs that were then valid (a 0.8 chance to run costs a fifth of the job's energy) without the failures it
rightly expected to offset them: on eight random held-out splits of the sample, that bias was -4.5 % on
average (-0.6 to -16 %). The failure model is measured by jobs completed and GPU-hours.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from twin.cluster import Cluster, NodeSpec, gpu_tdp_watts
from twin.domain import GPUS_PER_NODE, JobConfig, canonical_gpu_name
from twin.ensemble import relative_error, run_ensemble, spread
from twin.forecast import ForecastOptions, TwinInputs, json_safe, make_spec
from twin.job_config import descriptors_of
from twin.plan import (
    DEFAULT_FAILURE_TIMES_S,
    DEFAULT_POWER_FRACTION,
    STREAM_FAIL_TIME,
    STREAMS,
    JobPlan,
    PreparedCatalog,
    Reject,
    pool_index,
    prepare_catalog,
)
from twin.policies import Policy
from twin.protocols import JobModels
from twin.randomness import job_keys, job_uniforms
from twin.simulator import End, SimResult, simulate
from twin.slo_attainment import SloSet
from twin.units import JOULES_PER_KWH
from twin.workload import RunningState, Workload, catalog_key

# Offered load of the replayed arrivals: busy enough that queueing matters, not so busy it never drains.
DEFAULT_LOAD = 0.7
DEFAULT_NODES = 8
FIGURES = ("jobs_completed", "gpu_hours", "wait_mean_s", "makespan_s", "energy_kwh")


@dataclass
class ReplayedBenchmark:
    """The benchmark as jobs (arrival order) and what each one really did."""

    workload: Workload  # configurations, work and arrival times: what the twin may know
    truth_hold_s: np.ndarray  # how long each job held its GPUs
    truth_outcome: np.ndarray  # End codes
    truth_power_w: np.ndarray  # per GPU: measured when the benchmark has it
    truth_tokens_per_s: np.ndarray  # measured throughput (NaN when the job did not run to the end)
    truth_reject: np.ndarray  # Reject codes
    truth_has_power: np.ndarray  # bool: the row carries its measured power


def _configs(table: pd.DataFrame) -> tuple[list[JobConfig], np.ndarray]:
    index: dict[object, int] = {}
    configs: list[JobConfig] = []
    idx = np.empty(len(table), dtype=np.int64)
    for i, row in enumerate(table.itertuples(index=False)):
        limit = row.time_limit_s
        config = JobConfig(
            model_name=str(row.model_name),
            method=str(row.method),
            gpu_model=canonical_gpu_name(str(row.gpu_model)),
            number_gpus=int(row.number_gpus),
            number_nodes=int(row.number_nodes),
            batch_size=int(row.batch_size),
            tokens_per_sample=int(row.tokens_per_sample),
            enable_roce=bool(row.enable_roce),
            fast_moe=int(row.fast_moe),
            fast_kernels=bool(row.fast_kernels),
            time_limit_s=None
            if limit is None or (isinstance(limit, float) and math.isnan(limit))
            else float(limit),
            extra=descriptors_of(row),
        )
        k = index.setdefault(catalog_key(config), len(configs))
        if k == len(configs):
            configs.append(config)
        idx[i] = k
    return configs, idx


def _work(table: pd.DataFrame) -> np.ndarray:
    """Dataset tokens of each job: measured for valid runs; for the others, the median of valid runs of the
    same protocol, batch and sequence length (then of the protocol, then of all): what a submitter says."""
    measured = (table["dataset_tokens_per_second"] * table["train_runtime"]).where(
        table["outcome"] == "valid"
    )
    work = measured.copy()
    for keys in (["experiment_id", "batch_size", "tokens_per_sample"], ["experiment_id"]):
        median = measured.groupby([table[k] for k in keys]).transform("median")
        work = work.fillna(median)
    fallback = float(measured.median()) if measured.notna().any() else 3_145_728.0
    return work.fillna(fallback).to_numpy(dtype=float)


def demand_cluster(
    table: pd.DataFrame, nodes: int = DEFAULT_NODES, gpus_per_node: int = GPUS_PER_NODE
) -> Cluster:
    """Nodes per GPU type in proportion to the GPU time the benchmark's valid runs ask of each type, at
    least one, and enough whole nodes for the type's biggest job."""
    valid = table[table["outcome"] == "valid"]
    demand = (valid["number_gpus"] * valid["train_runtime"]).groupby(valid["gpu_model"]).sum()
    types = sorted({canonical_gpu_name(g) for g in table["gpu_model"]})
    total = float(demand.sum()) or 1.0
    specs: list[NodeSpec] = []
    for name in types:
        share = float(demand.get(name, 0.0)) / total
        biggest = int(table.loc[table["gpu_model"].map(canonical_gpu_name) == name, "number_gpus"].max())
        count = max(1, round(share * nodes), math.ceil(biggest / gpus_per_node))
        specs.extend(NodeSpec(f"{name}-{k}", name, gpus_per_node) for k in range(count))
    return Cluster(tuple(specs))


def replay_benchmark(
    table: pd.DataFrame, cluster: Cluster, rng: np.random.Generator, load: float = DEFAULT_LOAD
) -> ReplayedBenchmark:
    """Rows in a random order, arriving as a Poisson process that offers the cluster `load`."""
    if not load > 0:
        raise ValueError("the offered load must be positive")
    order = rng.permutation(len(table))
    table = table.iloc[order].reset_index(drop=True)
    n = len(table)
    configs, config_idx = _configs(table)
    outcome = table["outcome"].to_numpy()
    job_ids = [f"bench-{int(line)}" for line in table["line"]]
    valid = outcome == "valid"
    runtime_failed = outcome == "runtime"
    fail_u = job_uniforms(int(rng.integers(0, 2**62)), job_keys(job_ids), STREAMS)[:, STREAM_FAIL_TIME]
    fail_after = np.quantile(DEFAULT_FAILURE_TIMES_S, fail_u)
    hold = np.where(valid, table["train_runtime"].to_numpy(float), np.where(runtime_failed, fail_after, 0.0))
    gpus = table["number_gpus"].to_numpy(np.int64)
    mean_gpu_seconds = float((gpus * hold).mean())
    rate = load * cluster.total_gpus / mean_gpu_seconds if mean_gpu_seconds > 0 else 1.0
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    measured_power = table["gpu_power_watts_avg"].to_numpy(float)
    has_power = np.isfinite(measured_power) & (measured_power > 0)
    tdp = np.array([gpu_tdp_watts(c.gpu_model) * DEFAULT_POWER_FRACTION for c in configs])[config_idx]
    workload = Workload(
        job_ids=job_ids,
        arrival_s=arrival,
        gpus=gpus,
        gpu_models=[configs[k].gpu_model for k in config_idx],
        duration_s=np.full(n, np.nan),
        work_tokens=_work(table),
        config_idx=config_idx,
        catalog=configs,
    )
    return ReplayedBenchmark(
        workload=workload,
        truth_hold_s=hold,
        truth_outcome=np.where(
            valid, End.COMPLETED, np.where(runtime_failed, End.FAILED, End.REJECTED)
        ).astype(np.int8),
        truth_power_w=np.where(has_power, measured_power, tdp),
        truth_tokens_per_s=np.where(valid, table["dataset_tokens_per_second"].to_numpy(float), np.nan),
        truth_reject=np.where(outcome == "rejected", Reject.RULE, Reject.NONE).astype(np.int8),
        truth_has_power=has_power,
    )


def scheduler_estimates(replay: ReplayedBenchmark, catalog: PreparedCatalog) -> np.ndarray:
    """What a real scheduler would believe each job takes: its work at the predicted median throughput
    (the same belief the twin's scheduler has), capped by the protocol's time limit."""
    w = replay.workload
    p50 = np.maximum(np.nan_to_num(catalog.throughput[w.config_idx, 1], nan=1.0), 1e-9)
    limit = catalog.run_limits_s()[w.config_idx]
    return np.minimum(w.work_tokens / p50, limit)


def truth_plan(replay: ReplayedBenchmark, cluster: Cluster, estimate_s: np.ndarray) -> JobPlan:
    w = replay.workload
    pool, pools, fits = pool_index(w, cluster)
    reject = np.where((replay.truth_reject == Reject.NONE) & ~fits, Reject.NO_CAPACITY, replay.truth_reject)
    return JobPlan(
        job_ids=list(w.job_ids),
        row=np.arange(len(w)),
        arrival_s=w.arrival_s.copy(),
        gpus=w.gpus.copy(),
        pool=pool,
        pools=pools,
        hold_s=replay.truth_hold_s.copy(),
        fails=replay.truth_outcome == End.FAILED,
        estimate_s=np.asarray(estimate_s, dtype=float),
        power_w=replay.truth_power_w.copy(),
        reject=reject.astype(np.int8),
        elapsed_s=np.full(len(w), np.nan),
    )


def parse_window(text: str | None) -> tuple[float, float]:
    """`START:END` as durations on the replay's clock (`0:24h`, `12h:`, `:2d`); None = everything."""
    from twin.units import parse_duration

    if text is None or text.strip() in ("", ":"):
        return 0.0, math.inf
    if ":" not in text:
        raise ValueError(f"a window is START:END (e.g. 0:24h), got {text!r}")
    start_text, end_text = (p.strip() for p in text.split(":", 1))
    start = 0.0 if start_text in ("", "0") else parse_duration(start_text)
    end = math.inf if end_text == "" else parse_duration(end_text)
    if end <= start:
        raise ValueError(f"the window ends before it starts: {text!r}")
    return start, end


def window_workload(
    replay: ReplayedBenchmark, truth: SimResult, start: float, end: float
) -> tuple[Workload, np.ndarray]:
    """What the twin knows at `start`: jobs queued, jobs running (progress and measured rate), and the jobs
    arriving before `end`; times shifted so the window starts at 0. Also the replay's rows it covers."""
    w = replay.workload
    began = truth.start_s
    ended = truth.end_s
    running = (began < start) & (ended > start)
    waiting = (w.arrival_s < start) & ~(began < start) & (truth.outcome != End.REJECTED)
    arriving = (w.arrival_s >= start) & (w.arrival_s < end)
    rows = np.flatnonzero(running | waiting | arriving)
    states: dict[int, RunningState] = {}
    for k, row in enumerate(rows):
        if running[row]:
            elapsed = start - float(began[row])
            rate = float(replay.truth_tokens_per_s[row])
            states[k] = RunningState(
                elapsed_s=elapsed,
                tokens_done=elapsed * rate if math.isfinite(rate) else None,
                tokens_per_second=rate if math.isfinite(rate) else None,
                # what its progress reports carry, as the replay's do
                power_w=float(replay.truth_power_w[row]) if replay.truth_has_power[row] else None,
            )
    part = Workload(
        job_ids=[w.job_ids[r] for r in rows],
        arrival_s=w.arrival_s[rows] - start,
        gpus=w.gpus[rows],
        gpu_models=[w.gpu_models[r] for r in rows],
        duration_s=w.duration_s[rows],
        work_tokens=w.work_tokens[rows],
        config_idx=w.config_idx[rows],
        catalog=w.catalog,
        running=states,
    )
    return part, rows


def truth_figures(
    replay: ReplayedBenchmark, plan: JobPlan, truth: SimResult, rows: np.ndarray, start: float
) -> dict[str, float]:
    began, ended = truth.start_s[rows], truth.end_s[rows]
    queued_from = plan.arrival_s[rows]
    already = began < start
    held = np.maximum(ended - np.maximum(began, start), 0.0)
    held = np.where(np.isnan(began), 0.0, held)
    waits = (began - queued_from)[~already & ~np.isnan(began)]
    measured = replay.truth_has_power[rows]
    energy_j = (held * plan.gpus[rows] * plan.power_w[rows])[measured].sum()
    return {
        "jobs_completed": float((truth.outcome[rows] == End.COMPLETED).sum()),
        "gpu_hours": float((held * plan.gpus[rows]).sum() / 3600.0),
        "wait_mean_s": float(waits.mean()) if len(waits) else 0.0,
        "makespan_s": float(np.nanmax(ended) - start) if len(rows) else 0.0,
        "energy_kwh": float(energy_j / JOULES_PER_KWH),
    }


def run_backtest(
    table: pd.DataFrame,
    models: JobModels,
    *,
    cluster: Cluster | None = None,
    window: tuple[float, float] = (0.0, math.inf),
    policy: Policy = Policy.FIFO,
    runs: int = 8,
    seed: int = 0,
    load: float = DEFAULT_LOAD,
    workers: int | None = None,
    model_source: str = "calibrated",
    progress: Callable[[], object] | None = None,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """The twin against the replayed truth; errors are (twin mean - truth) / truth. The twin's ensemble
    runs on Ray when `ray_address` is given."""
    cluster = cluster or demand_cluster(table)
    rng = np.random.default_rng(seed)
    replay = replay_benchmark(table, cluster, rng, load)
    plan = truth_plan(
        replay, cluster, scheduler_estimates(replay, prepare_catalog(replay.workload.catalog, models))
    )
    truth = simulate(cluster, plan, policy)
    start, end = window
    workload, rows = window_workload(replay, truth, start, end)
    if not len(rows):
        raise ValueError(f"no job arrives or waits in the window {start:g}-{end:g} s (the replay spans "
                         f"{float(replay.workload.arrival_s[-1]):.0f} s)")  # fmt: skip
    truth_values = truth_figures(replay, plan, truth, rows, start)
    options = ForecastOptions(
        horizon_s=None, runs=runs, seed=seed, policy=policy, workers=workers, ray_address=ray_address
    )
    spec = make_spec(TwinInputs(cluster, workload), models, options, SloSet(slos=[]))
    measured = replay.truth_has_power[rows]
    spec.energy_jobs = frozenset(workload.job_ids[k] for k in np.flatnonzero(measured))
    outputs = run_ensemble(spec, runs, workers, progress, ray_address=ray_address)
    figures: dict[str, Any] = {}
    for name in FIGURES:
        key = "energy_kwh_if_run" if name == "energy_kwh" else name
        forecast = spread([o.summary[key] for o in outputs])
        actual = truth_values[name]
        mean = forecast["mean"]
        figures[name] = {
            "truth": actual,
            "twin": forecast,
            "error": relative_error(mean, actual),
        }
    replayed_span = float(replay.workload.arrival_s[-1])
    return json_safe(
        {
            "jobs_in_window": int(len(rows)),
            "jobs_in_benchmark": int(len(table)),
            "window_s": [start, None if math.isinf(end) else end],
            "replay_span_s": replayed_span,
            "offered_load": load,
            "policy": str(policy),
            "runs": runs,
            "seed": seed,
            "models": model_source,
            "cluster": cluster.describe(),
            "energy_jobs": int(measured.sum()),  # the jobs energy is compared on (measured power)
            "truth_outcomes": {
                label: int((truth.outcome[rows] == code).sum())
                for label, code in (
                    ("completed", End.COMPLETED),
                    ("failed", End.FAILED),
                    ("rejected", End.REJECTED),
                )
            },
            "figures": figures,
        }
    )
