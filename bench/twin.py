"""Twin speed: a week of a 512-GPU cluster with 100k jobs, one run and a 32-run ensemble.

    .venv/bin/python bench/twin.py [--jobs 100000] [--days 7] [--runs 32] [--policy fifo]

Cluster: 64 nodes of 8 GPUs (32 A100-SXM, 16 A100-PCIe, 8 L40S, 8 H100-PCIe). Jobs: configurations and
work resampled from the bundled benchmark sample's valid runs, each moved to a GPU type in proportion to
the pools' sizes, arriving as a Poisson process over the week; their work is scaled so the offered load
is ~70 % (a busy cluster with queues, not an overloaded one that only grows its queue). Throughput,
failures and power come from the uncalibrated fallback models (the models are asked once per distinct
configuration before the runs, so which models does not change the simulation's speed).

Measures, each in a fresh process: one run (plan + SimPy simulation + metrics) as simulated seconds per
wall second, and its peak memory (what the run allocates, by tracemalloc, and the process's max RSS);
then the 32-run ensemble's wall time on one process and on both cores. Baselines: the 1e5 simulated s
per wall s target, and OpenDT (about one hour to replay 7 days: ~168 simulated s per wall s).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from twin.policies import Policy  # noqa: E402

TARGET_SIM_S_PER_WALL_S = 1e5
OPENDT_SIM_S_PER_WALL_S = 7 * 86400 / 3600.0  # 7 days in about an hour
NODES = (("NVIDIA-A100-SXM4-80GB", 32), ("NVIDIA-A100-80GB-PCIe", 16), ("L40S", 8), ("NVIDIA-H100-PCIe", 8))
LOAD = 0.7


def build_spec(jobs: int, days: float, policy: str, seed: int = 0):  # type: ignore[no-untyped-def]
    from calibrate.loader import bundled_benchmark_path, load_benchmark
    from twin.cluster import cluster_from_spec
    from twin.ensemble import EnsembleSpec
    from twin.plan import build_plan, prepare_catalog
    from twin.uncalibrated import FallbackModels
    from twin.workload import Workload

    cluster = cluster_from_spec({"nodes": [{"gpu_model": g, "count": c} for g, c in NODES]})
    table = load_benchmark(bundled_benchmark_path())
    valid = table[(table["outcome"] == "valid") & (table["number_gpus"] <= 32)].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    horizon = days * 86400.0
    arrival = np.sort(rng.uniform(0.0, horizon, jobs))
    rows = rng.integers(0, len(valid), jobs)
    share = np.array([c for _, c in NODES], dtype=float)
    gpu_of = rng.choice(len(NODES), size=jobs, p=share / share.sum())
    catalog: list = []
    index: dict = {}
    config_idx = np.empty(jobs, dtype=np.int64)
    from twin.domain import JobConfig

    for k, (row, g) in enumerate(zip(rows, gpu_of, strict=True)):
        r = valid.iloc[row]
        config = JobConfig(
            str(r.model_name), str(r.method), NODES[g][0], int(r.number_gpus), int(r.number_nodes),
            int(r.batch_size), int(r.tokens_per_sample), bool(r.enable_roce), int(r.fast_moe),
            bool(r.fast_kernels),
        )  # fmt: skip
        config_idx[k] = index.setdefault(config, len(catalog))
        if config_idx[k] == len(catalog):
            catalog.append(config)
    work = (valid["dataset_tokens_per_second"] * valid["train_runtime"]).to_numpy()[rows]
    gpus = np.array([catalog[k].number_gpus for k in config_idx])
    workload = Workload(
        job_ids=[f"job-{k}" for k in range(jobs)], arrival_s=arrival, gpus=gpus,
        gpu_models=[catalog[k].gpu_model for k in config_idx], duration_s=np.full(jobs, np.nan),
        work_tokens=work, config_idx=config_idx, catalog=catalog,
    )  # fmt: skip
    prepared = prepare_catalog(catalog, FallbackModels())
    # Scale the work so the offered load (GPU-seconds asked per GPU-second available) is LOAD.
    plan = build_plan(workload, prepared, cluster, 1)
    offered = float((plan.hold_s * plan.gpus).sum()) / (cluster.total_gpus * horizon)
    workload.work_tokens = work * (LOAD / offered)
    return EnsembleSpec(
        cluster=cluster, workload=workload, catalog=prepared, policy=policy, horizon_s=horizon,
        interval_s=3600.0,
    )  # fmt: skip


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def one_run(jobs: int, days: float, policy: str, queue) -> None:  # type: ignore[no-untyped-def]
    """In a fresh process: build the spec, then time one run and its peak memory."""
    spec = build_spec(jobs, days, policy)
    import simpy

    from twin.ensemble import run_one, run_streams
    from twin.plan import build_plan
    from twin.randomness import run_key
    from twin.simulator import simulate

    began = time.perf_counter()
    output = run_one(spec, 0)
    wall = time.perf_counter() - began
    # Memory of the run itself (tracemalloc sees numpy's buffers too), in a second, untimed run.
    import tracemalloc

    tracemalloc.start()
    run_one(spec, 0)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The simulation alone (no plan, no metrics), on the same run's plan.
    plan = build_plan(spec.workload, spec.catalog, spec.cluster, run_key(run_streams(spec.seed, 0)[1]))
    began = time.perf_counter()
    result = simulate(spec.cluster, plan, spec.policy, spec.horizon_s, env=simpy.Environment())
    sim_wall = time.perf_counter() - began
    queue.put(
        {
            "wall_s": wall,
            "sim_wall_s": sim_wall,
            "peak_mb": traced_peak / 2**20,
            "rss_mb": _rss_mb(),
            "completed": output.summary["jobs_completed"],
            "utilization": output.summary["utilization"],
            "wait_mean_s": output.summary["wait_mean_s"],
            "started": int(np.isfinite(result.start_s).sum()),
        }
    )


def ensemble(jobs: int, days: float, policy: str, runs: int, workers: int, queue) -> None:  # type: ignore[no-untyped-def]
    spec = build_spec(jobs, days, policy)
    from twin.ensemble import run_ensemble

    began = time.perf_counter()
    outputs = run_ensemble(spec, runs, workers)
    queue.put({"wall_s": time.perf_counter() - began, "runs": len(outputs)})


def in_fresh_process(target, *args):  # type: ignore[no-untyped-def]
    context = get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--policy", default="fifo", choices=[p.value for p in Policy])
    parser.add_argument("--skip-serial", action="store_true", help="skip the one-process ensemble")
    args = parser.parse_args()
    horizon = args.days * 86400.0

    single = in_fresh_process(one_run, args.jobs, args.days, args.policy)
    rate = horizon / single["wall_s"]
    sim_rate = horizon / single["sim_wall_s"]
    both = in_fresh_process(ensemble, args.jobs, args.days, args.policy, args.runs, 2)
    serial = (
        None
        if args.skip_serial
        else in_fresh_process(ensemble, args.jobs, args.days, args.policy, args.runs, 1)
    )

    print(f"twin: 512 GPUs (64 nodes, 4 GPU types), {args.jobs:,} jobs over {args.days:g} days, policy "
          f"{args.policy}; one run completed {single['completed']:,.0f} jobs, utilization "
          f"{single['utilization']:.0%}, mean wait {single['wait_mean_s']:,.0f} s")  # fmt: skip
    rows = [
        ("one run: simulated s / wall s", f"{rate:,.0f}", f"{TARGET_SIM_S_PER_WALL_S:,.0f} (target)",
         f"{rate / TARGET_SIM_S_PER_WALL_S:.2f}x"),
        ("  same, vs OpenDT", f"{rate:,.0f}", f"{OPENDT_SIM_S_PER_WALL_S:,.0f} (OpenDT)",
         f"{rate / OPENDT_SIM_S_PER_WALL_S:,.0f}x"),
        ("one run: wall s (plan+sim+metrics)", f"{single['wall_s']:.2f}", "-", "-"),
        ("  simulation alone: sim s / wall s", f"{sim_rate:,.0f}", f"{TARGET_SIM_S_PER_WALL_S:,.0f} (target)",
         f"{sim_rate / TARGET_SIM_S_PER_WALL_S:.2f}x"),
        ("one run: peak memory allocated (MB)", f"{single['peak_mb']:.0f}", "-", "-"),
        ("  process max RSS incl. inputs (MB)", f"{single['rss_mb']:.0f}", "-", "-"),
        (f"{args.runs}-run ensemble, 2 processes: wall s", f"{both['wall_s']:.1f}",
         f"{serial['wall_s']:.1f} (1 process)" if serial else "-",
         f"{serial['wall_s'] / both['wall_s']:.2f}x faster" if serial else "-"),
        (f"{args.runs}-run ensemble vs OpenDT", f"{both['wall_s']:.1f}",
         f"{args.runs * 3600:,.0f} (OpenDT, {args.runs} x 1 h)",
         f"{args.runs * 3600 / both['wall_s']:,.0f}x"),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':{width}}  {'value':>12}  {'baseline':>26}  {'ratio':>12}")
    for name, value, baseline, ratio in rows:
        print(f"{name:{width}}  {value:>12}  {baseline:>26}  {ratio:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
