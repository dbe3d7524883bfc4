"""Capacity-plan sweep speed: 24 scenarios x 32 runs on the local pool (1 and 2 processes) and on Ray.

    .venv/bin/python bench/plan.py [--runs 32] [--jobs-per-day 600] [--ray-cpus 2]

The sweep: A100-SXM nodes 2..7 x L40S nodes 1..2 x policy fifo/backfill = 24 scenarios, each 32 seeded
runs of 24 h of a live-like arrival process (the mix resampled from the bundled benchmark's valid runs of
up to 8 GPUs, throughput from the uncalibrated fallback models; work scaled so the offered load is ~80 %
of the 5+1-node cluster). Tasks are scenario x 8 runs (96 tasks), the same on every executor.

Ray: a real head started here as a subprocess on loopback with `--num-cpus` worker CPUs (stopped by its
process group, never `ray stop`); the driver connects before the clock starts, so the figure includes
putting the inputs in the object store and the tasks' scheduling, not Ray's start-up. Each executor is
timed once, cold (the local pool's process start-up and Ray's workers' first import are in the figure).
The three answers must be identical apart from the executor and timings; the script checks it.

On this machine the two cores are shared with other work: the ratios say how much of the second core a
sweep gets, and Ray's figure how much its scheduling costs over the local pool's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

A100, L40S = "NVIDIA-A100-SXM4-80GB", "L40S"
LOAD = 0.8


def build_inputs(jobs_per_day: float, reference_nodes: tuple[int, int] = (5, 1), seed: int = 0):  # type: ignore[no-untyped-def]
    from calibrate.loader import bundled_benchmark_path, load_benchmark
    from twin.arrivals import ArrivalModel
    from twin.cluster import cluster_from_spec
    from twin.domain import JobConfig
    from twin.forecast import TwinInputs
    from twin.plan import build_plan, prepare_catalog
    from twin.uncalibrated import FallbackModels
    from twin.workload import Workload

    table = load_benchmark(bundled_benchmark_path())
    valid = table[(table["outcome"] == "valid") & (table["number_gpus"] <= 8)].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, len(valid), 400)
    catalog: list[JobConfig] = []
    index: dict[JobConfig, int] = {}
    config_idx = np.empty(len(rows), dtype=np.int64)
    for k, row in enumerate(rows):
        r = valid.iloc[row]
        gpu = A100 if rng.random() < 0.9 else L40S
        config = JobConfig(
            str(r.model_name), str(r.method), gpu, int(r.number_gpus), int(r.number_nodes),
            int(r.batch_size), int(r.tokens_per_sample), bool(r.enable_roce), int(r.fast_moe),
            bool(r.fast_kernels),
        )  # fmt: skip
        config_idx[k] = index.setdefault(config, len(catalog))
        if config_idx[k] == len(catalog):
            catalog.append(config)
    work = (valid["dataset_tokens_per_second"] * valid["train_runtime"]).to_numpy()[rows]
    mix = Workload(
        job_ids=[f"mix-{k}" for k in range(len(rows))], arrival_s=np.zeros(len(rows)),
        gpus=np.array([catalog[k].number_gpus for k in config_idx]),
        gpu_models=[catalog[k].gpu_model for k in config_idx], duration_s=np.full(len(rows), np.nan),
        work_tokens=work, config_idx=config_idx, catalog=catalog,
    )  # fmt: skip
    a100_nodes, l40s_nodes = reference_nodes
    reference = cluster_from_spec(
        {"nodes": [{"gpu_model": A100, "count": a100_nodes}, {"gpu_model": L40S, "count": l40s_nodes}]}
    )
    # Scale the work so the mix offers LOAD of the reference cluster at this arrival rate.
    plan = build_plan(mix, prepare_catalog(catalog, FallbackModels()), reference, 1)
    gpu_seconds_per_job = float((plan.hold_s * plan.gpus).mean())
    mix.work_tokens = work * (LOAD * reference.total_gpus * 86400.0 / (jobs_per_day * gpu_seconds_per_job))
    arrivals = ArrivalModel(hourly_rate=np.full(24, jobs_per_day / 24.0), mix=mix)
    base = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 1}, {"gpu_model": L40S, "count": 1}]})
    return TwinInputs(cluster=base, workload=Workload.empty(catalog), arrivals=arrivals), FallbackModels()


def request(runs: int):  # type: ignore[no-untyped-def]
    from twin.capacity import SweepRequest

    return SweepRequest(
        vary=[f"{A100}=2..7", f"{L40S}=1..2"], policies=["fifo", "backfill"], runs=runs, seed=1,
        horizon="24h", interval="1h",
    )  # fmt: skip


def slos():  # type: ignore[no-untyped-def]
    from twin.slo_attainment import Slo, SloSet

    return SloSet(
        slos=[
            Slo(name="p95 wait <= 1 h", metric="wait_p95_s", max=3600.0),
            Slo(name="utilization >= 30 %", metric="utilization", min=0.3),
        ]
    )


def timed(inputs, models, runs: int, executor) -> tuple[float, float, dict]:  # type: ignore[no-untyped-def]
    """Wall seconds, CPU seconds of this process (the whole work when it runs the tasks itself: the pool's
    forkserver workers and Ray's are not our children to count), and the answer."""
    import resource

    from twin.capacity import run_sweep

    def cpu() -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    began, cpu_began = time.perf_counter(), cpu()
    doc = run_sweep(inputs, models, request(runs), slos(), executor)
    return time.perf_counter() - began, cpu() - cpu_began, doc


def large_run(jobs_per_day: float) -> tuple[float, float, float]:
    """One 24 h run of a 10,000-GPU cluster (1,125 A100 + 125 L40S nodes) at `jobs_per_day`: wall seconds,
    CPU seconds, and the peak memory the run allocates (tracemalloc, MB) - the unit of docs/scaling.md."""
    import tracemalloc

    from twin.capacity import SweepTask, prepare_inputs, run_sweep_task
    from twin.config_changes import Admission
    from twin.policies import Policy

    inputs, models = build_inputs(jobs_per_day, reference_nodes=(1125, 125))
    shared = prepare_inputs(inputs, models, request(1), slos())
    task = SweepTask(0, ((L40S, 125), (A100, 1125)), Policy.BACKFILL, Admission.OFF, 0, 1)
    began, cpu_began = time.perf_counter(), time.process_time()
    run_sweep_task(shared, task)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    tracemalloc.start()
    run_sweep_task(shared, task)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return wall, cpu, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--jobs-per-day", type=float, default=600.0)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--large-jobs-per-day", type=float, default=1e6 / 7, help="0 skips the large run")
    args = parser.parse_args()

    from twin.capacity import without_timings
    from twin.executors import LocalExecutor, RayExecutor

    inputs, models = build_inputs(args.jobs_per_day)
    load_before = os.getloadavg()[0]
    results: dict[str, tuple[float, float, dict]] = {}
    results["local, 1 process"] = timed(inputs, models, args.runs, LocalExecutor(1))
    results["local, 2 processes"] = timed(inputs, models, args.runs, LocalExecutor(2))

    from tests.ray_head import RayHead

    head = RayHead(cpus=args.ray_cpus).start()
    try:
        import ray

        ray.init(address=head.address, log_to_driver=False, configure_logging=False)
        ray.get(ray.remote(lambda: None).remote())  # the connection is up before the clock starts
        ray_name = f"Ray, {args.ray_cpus} worker CPUs"
        results[ray_name] = timed(inputs, models, args.runs, RayExecutor(head.address))
        ray.shutdown()
    finally:
        head.stop()

    answers = {json.dumps(without_timings(doc), sort_keys=True) for *_, doc in results.values()}
    first = next(iter(results.values()))[2]
    scenarios, runs = len(first["scenarios"]), len(first["scenarios"]) * args.runs
    cheapest = first["cheapest"]
    print(
        f"plan: {scenarios} scenarios x {args.runs} runs ({first['tasks']} tasks), 24 h of "
        f"{args.jobs_per_day:g} jobs/day each; {os.cpu_count()} cores, load average {load_before:.1f} before "
        f"and {os.getloadavg()[0]:.1f} after (other work on the machine shares the cores)"
    )
    print(f"identical answers on every executor: {len(answers) == 1}")
    if cheapest is not None:
        cost = cheapest["gpu_hours_per_day"]
        print(f"cheapest: {cheapest['nodes']} {cheapest['policy']} ({cost:g} GPU-h/day)")
    base_wall = results["local, 1 process"][0]
    width = 22
    print(f"{'executor':{width}}  {'wall s':>7}  {'scenarios/s':>11}  {'runs/s':>7}  {'vs 1 process':>12}  "
          f"{'CPU s':>12}  {'CPU ms/run':>10}")  # fmt: skip
    for name, (wall, cpu, _) in results.items():
        cpu_text = (
            f"{cpu:>12.1f}  {1000 * cpu / runs:>10.1f}"
            if name == "local, 1 process"  # the others' workers are not our children to count
            else f"{'-':>12}  {'-':>10}"
        )
        print(
            f"{name:{width}}  {wall:>7.2f}  {scenarios / wall:>11.2f}  {runs / wall:>7.1f}  "
            f"{base_wall / wall:>11.2f}x  {cpu_text}"
        )
    if args.large_jobs_per_day:
        wall, cpu, peak = large_run(args.large_jobs_per_day)
        print(
            f"one 24 h run at 10,000 GPUs and {args.large_jobs_per_day:,.0f} jobs/day (backfill): "
            f"{wall:.1f} s wall, {cpu:.1f} s CPU, peak {peak:,.0f} MB allocated"
        )
    if len(answers) != 1:
        sys.exit("the executors disagree")


if __name__ == "__main__":
    main()
