"""`finetwin plan`: the cheapest cluster (and policy) that meets the SLOs, a thin handler over
`twin.capacity`. Registration imports argparse only."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from twin.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    plan = subparsers.add_parser(
        "plan",
        help="capacity plan: the cheapest cluster and policy that meets the SLOs (a sweep of scenarios)",
        description="Every combination of --vary ranges, --policy and --admission is a scenario; each runs "
        "--runs seeded runs (the same seeds in every scenario). A scenario meets the SLOs when each holds in "
        "at least --confidence of its runs. Without --workload, the workload is the live arrival process "
        "from the store (and the cluster the store's, unless --cluster is given).",
    )
    plan.add_argument("--cluster", type=Path, default=None, metavar="C.yaml", help="the base cluster")
    plan.add_argument("--workload", type=Path, default=None, metavar="JOBS.csv", help="explicit jobs")
    plan.add_argument("--slo", type=Path, default=None, metavar="SLO.yaml", help="default FINETWIN_SLO_FILE")
    plan.add_argument(
        "--vary", action="append", required=True, metavar="GPU=MIN..MAX",
        help="nodes of one GPU type, e.g. NVIDIA-A100-SXM4-80GB=1..6 (repeatable)",
    )  # fmt: skip
    plan.add_argument("--policy", default="fifo", help="comma-separated: fifo,backfill,spf")
    plan.add_argument("--admission", default="off", help="comma-separated: off,reject,repair")
    plan.add_argument("--runs", type=int, default=16, help="seeded runs per scenario (16)")
    plan.add_argument("--seed", type=int, default=0)
    plan.add_argument("--confidence", type=float, default=0.9, help="share of runs each SLO must hold in")
    plan.add_argument("--horizon", default=None, help="window, e.g. 24h (default: live 24h, file: all jobs)")
    plan.add_argument("--interval", default="1h", help="width of one interval for SLO attainment (1h)")
    plan.add_argument("--chunk", type=int, default=None, help="runs per task (8)")
    plan.add_argument(
        "--ray", default=None, metavar="ADDRESS", help="Ray cluster (default FINETWIN_RAY_ADDRESS)"
    )
    plan.add_argument("--workers", type=int, default=None, help="local processes (default: every core)")
    plan.add_argument(
        "--models", type=Path, default=None, metavar="DIR",
        help="model registry directory (default FINETWIN_MODELS_DIR or DATA_DIR/models)",
    )  # fmt: skip
    plan.add_argument("--json", action="store_true", help="print JSON")
    plan.set_defaults(handler=run_plan_command)


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def run_plan_command(args: argparse.Namespace, settings: Settings) -> int:
    from pydantic import ValidationError

    from twin.capacity import SweepError, SweepRequest, run_sweep
    from twin.cli import CommandError
    from twin.commands import _emit, _first_error, _job_models, _needs_models, _progress
    from twin.executors import ExecutorUnavailable, close_executor, make_executor
    from twin.slo_attainment import SloFormatError, load_slos

    live = args.workload is None
    horizon = (
        args.horizon
        if args.horizon is not None
        else (f"{settings.forecast_horizon_hours}h" if live else None)
    )
    fields: dict[str, Any] = {
        "vary": args.vary,
        "policies": _split(args.policy),
        "admissions": _split(args.admission),
        "runs": args.runs,
        "seed": args.seed,
        "confidence": args.confidence,
        "horizon": horizon,
        "interval": args.interval,
    }
    if args.chunk is not None:
        fields["chunk_runs"] = args.chunk
    try:
        request = SweepRequest.model_validate(fields)
    except ValidationError as exc:
        raise CommandError(_first_error(exc)) from None
    try:
        slos = load_slos(args.slo if args.slo is not None else settings.slo_file)
    except SloFormatError as exc:
        raise CommandError(str(exc)) from None
    inputs = _inputs(args, settings)
    models, _source = _job_models(args, settings, needed=_needs_models(inputs))
    executor = make_executor(args.ray or settings.ray_address, args.workers)
    try:
        with _progress(_task_count(inputs, request), "plan", args.json) as tick:
            document = run_sweep(
                inputs, models, request, slos, executor, progress=(lambda *_: tick()) if tick else None
            )
    except (SweepError, ExecutorUnavailable, ValueError) as exc:
        raise CommandError(str(exc)) from None
    finally:
        close_executor(executor)
    _emit(document, args.json, _print_plan)
    for failed in document["failed"]:
        print(
            f"finetwin plan: scenario {failed['scenario']} ({failed['label']}): {failed['error']}",
            file=sys.stderr,
        )
    return 1 if document["failed"] else 0


def _task_count(inputs: Any, request: Any) -> int:
    from twin.capacity import enumerate_scenarios, make_tasks

    return len(make_tasks(enumerate_scenarios(inputs.cluster, request), request.runs, request.chunk_runs))


def _inputs(args: argparse.Namespace, settings: Settings) -> Any:
    """An explicit cluster and workload, or the live state (the store's arrival process and queue)."""
    from datetime import timedelta

    from twin.cli import CommandError
    from twin.cluster import ClusterFormatError, load_cluster
    from twin.commands import _explicit_inputs
    from twin.forecast import TwinInputs

    if args.workload is not None:
        if args.cluster is None:
            raise CommandError("--workload needs --cluster (the base cluster the ranges change)")
        return TwinInputs(*_explicit_inputs(args.cluster, args.workload))
    from twin.db import engine_from_settings, migrate
    from twin.live_state import NoClusterError, load_live_inputs

    engine = engine_from_settings(settings)
    migrate(engine)
    try:
        inputs = load_live_inputs(
            engine, cluster_id=settings.cluster_id, lookback=timedelta(days=settings.forecast_lookback_days)
        )
    except NoClusterError as exc:
        if args.cluster is None:
            raise CommandError(f"{exc} (or give --cluster)") from None
        raise CommandError(str(exc)) from None
    if args.cluster is not None:
        try:
            inputs.cluster = load_cluster(args.cluster)
        except ClusterFormatError as exc:
            raise CommandError(str(exc)) from None
    return inputs


def _print_plan(doc: dict[str, Any]) -> None:
    from twin.commands import _fmt

    print(
        f"{len(doc['scenarios'])} scenarios x {doc['runs']} runs "
        f"({doc['tasks']} tasks on {doc['executor']}), "
        f"confidence {doc['confidence']:.0%}; * = frontier"
    )
    names = doc["slos"]
    header = f"{'':2}{'#':>3} {'nodes':34} {'policy':9} {'admission':9}"
    for name in names:
        header += f" {name[:26]:>26}"
    print(header + f" {'GPU-h/day':>10} {'kWh/day':>9} meets")
    for k, row in enumerate(doc["scenarios"]):
        nodes = " ".join(f"{_short(gpu)}={n}" for gpu, n in row["nodes"].items())
        mark = "*" if row["frontier"] else " "
        line = f"{mark:2}{k:>3} {nodes[:34]:34} {row['policy']:9} {row['admission']:9}"
        for name in names:
            slo = row["slos"].get(name)
            if slo is None:
                line += f" {'failed':>26}"
                continue
            a = slo["attainment"]
            cell = f"{_fmt(a['mean'])} [{_fmt(a['p10'])},{_fmt(a['p90'])}] {slo['met_share']:.0%}"
            line += f" {cell:>26}"
        meets = "yes" if row["meets_slos"] else "no"
        print(line + f" {_fmt(row['gpu_hours_per_day']):>10} {_fmt(row['energy_kwh_per_day']):>9} {meets}")
    best = doc["cheapest"]
    if best is None:
        print("no scenario meets the SLOs: widen the ranges or relax --confidence")
    else:
        nodes = ", ".join(f"{n} x {gpu}" for gpu, n in best["nodes"].items())
        print(
            f"cheapest: {nodes} nodes, {best['policy']}, admission {best['admission']}: "
            f"{_fmt(best['gpu_hours_per_day'])} GPU-h/day, {_fmt(best['energy_kwh_per_day'])} kWh/day"
        )


def _short(gpu: str) -> str:
    from twin.domain import gpu_type

    try:
        return gpu_type(gpu).short
    except KeyError:
        return gpu
