"""`finetwin plan`: the cheapest cluster (and policy) that meets the SLOs, a sweep of what-ifs over
`twin.capacity` on a local process pool or on Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import Json, ModelsDir, first_error
from finetwin.commands.twin_inputs import (
    checked_workers,
    declared_slos,
    explicit_inputs,
    job_models,
    needs_models,
)
from finetwin.commands.twin_output import emit
from finetwin.errors import CommandError
from finetwin.numbers import short
from finetwin.settings import Settings


def register(app: typer.Typer) -> None:
    add_command(
        app,
        plan,
        "plan",
        help="capacity plan: the cheapest cluster and policy that meets the SLOs (a sweep of scenarios)",
        epilog="Every combination of --vary ranges, --policy and --admission is a scenario; each runs "
        "--runs seeded runs (the same seeds in every scenario). A scenario meets the SLOs when each holds in "
        "at least --confidence of its runs. Without --workload, the workload is the live arrival process "
        "from the store (and the cluster the store's, unless --cluster is given).",
    )


def plan(
    ctx: typer.Context,
    vary: Annotated[
        list[str],
        typer.Option(
            metavar="GPU=MIN..MAX", help="nodes of one GPU type, e.g. NVIDIA-A100-SXM4-80GB=1..6 (repeatable)"
        ),
    ],
    cluster: Annotated[Path | None, typer.Option(metavar="C.yaml", help="the base cluster")] = None,
    workload: Annotated[Path | None, typer.Option(metavar="JOBS.csv", help="explicit jobs")] = None,
    slo: Annotated[
        Path | None,
        typer.Option(
            metavar="SLO.yaml",
            help="default: the SLOs in force (declared with PUT /v1/slos, else FINETWIN_SLO_FILE)",
        ),
    ] = None,
    policy: Annotated[str, typer.Option(help="comma-separated: fifo,backfill,spf,conservative")] = "fifo",
    admission: Annotated[str, typer.Option(help="comma-separated: off,reject,repair")] = "off",
    runs: Annotated[int, typer.Option(help="seeded runs per scenario")] = 16,
    seed: Annotated[int, typer.Option()] = 0,
    confidence: Annotated[float, typer.Option(help="share of runs each SLO must hold in")] = 0.9,
    horizon: Annotated[
        str | None, typer.Option(help="window, e.g. 24h (default: live 24h, file: all jobs)")
    ] = None,
    interval: Annotated[str, typer.Option(help="width of one interval for SLO attainment")] = "1h",
    chunk: Annotated[int | None, typer.Option(help="runs per task (8)")] = None,
    ray: Annotated[
        str | None, typer.Option(metavar="ADDRESS", help="Ray cluster (default FINETWIN_RAY_ADDRESS)")
    ] = None,
    workers: Annotated[int | None, typer.Option(help="local processes (default: every core)")] = None,
    models: ModelsDir = None,
    as_json: Json = False,
) -> int:
    from pydantic import ValidationError

    from twin.capacity import SweepError, SweepRequest, run_sweep
    from twin.executors import ExecutorUnavailable, close_executor, make_executor
    from twin.slo_attainment import SloFormatError, load_slos

    settings: Settings = ctx.obj
    workers = checked_workers(workers)
    live = workload is None
    if horizon is None and live:
        horizon = f"{settings.forecast_horizon_hours}h"
    fields: dict[str, Any] = {
        "vary": vary, "policies": _split(policy), "admissions": _split(admission), "runs": runs, "seed": seed,
        "confidence": confidence, "horizon": horizon, "interval": interval,
    }  # fmt: skip
    if chunk is not None:
        fields["chunk_runs"] = chunk
    try:
        request = SweepRequest.model_validate(fields)
    except ValidationError as exc:
        raise CommandError(first_error(exc)) from None
    # Without --slo, the SLOs in force, as simulate, forecast, whatif and POST /v1/plan read them: declared
    # through the API, else FINETWIN_SLO_FILE, else the defaults (it read the file: a declared set missed).
    if slo is None:
        slos = declared_slos(settings)
    else:
        try:
            slos = load_slos(slo)
        except SloFormatError as exc:
            raise CommandError(str(exc)) from None
    inputs = _inputs(cluster, workload, settings)
    job_models_, _source = job_models(models, settings, needed=needs_models(inputs))
    executor = make_executor(ray or settings.ray_address, workers)
    try:
        with output.progress(_task_count(inputs, request), "plan", "tasks", quiet=as_json) as tick:
            document = run_sweep(
                inputs, job_models_, request, slos, executor, progress=(lambda *_: tick()) if tick else None
            )
    except (SweepError, ExecutorUnavailable, ValueError) as exc:
        raise CommandError(str(exc)) from None
    finally:
        close_executor(executor)
    emit(document, as_json, _print_plan)
    for failed in document["failed"]:
        output.say(
            f"finetwin plan: scenario {failed['scenario']} ({failed['label']}): {failed['error']}",
            stderr=True,
        )
    return 1 if document["failed"] else 0


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _task_count(inputs: Any, request: Any) -> int:
    from twin.capacity import enumerate_scenarios, make_tasks

    return len(make_tasks(enumerate_scenarios(inputs.cluster, request), request.runs, request.chunk_runs))


def _inputs(cluster: Path | None, workload: Path | None, settings: Settings) -> Any:
    """An explicit cluster and workload, or the live state (the store's arrival process and queue)."""

    from finetwin.wiring import migrated_engine
    from twin.cluster import ClusterFormatError, load_cluster
    from twin.forecast import TwinInputs
    from twin.live_state import NoClusterError, load_cluster_inputs

    if workload is not None:
        if cluster is None:
            raise CommandError("--workload needs --cluster (the base cluster the ranges change)")
        return TwinInputs(*explicit_inputs(cluster, workload))
    engine = migrated_engine(settings)
    try:
        inputs = load_cluster_inputs(engine, settings)
    except NoClusterError as exc:
        where = f"looked in the store {settings.store_description()}"
        if cluster is None:
            raise CommandError(f"{exc} ({where}; or give --cluster)") from None
        raise CommandError(f"{exc} ({where})") from None
    if cluster is not None:
        try:
            inputs.cluster = load_cluster(cluster)
        except ClusterFormatError as exc:
            raise CommandError(str(exc)) from None
    return inputs


def _print_plan(doc: dict[str, Any]) -> None:
    output.say(
        f"{len(doc['scenarios'])} scenarios x {doc['runs']} runs "
        f"({doc['tasks']} tasks on {doc['executor']}), confidence {doc['confidence']:.0%}; * = frontier"
    )
    names = doc["slos"]
    # A scenario that cannot place every job was a "no" without a reason in the table.
    unplaced = any(row.get("unplaceable_share") for row in doc["scenarios"])
    rows = []
    for k, row in enumerate(doc["scenarios"]):
        nodes = " ".join(f"{_short(gpu)}={n}" for gpu, n in row["nodes"].items())
        cells = ["*" if row["frontier"] else "", k, nodes, row["policy"], row["admission"]]
        for name in names:
            slo = row["slos"].get(name)
            if slo is None:
                cells.append("failed")
                continue
            a = slo["attainment"]
            cells.append(f"{short(a['mean'])} [{short(a['p10'])},{short(a['p90'])}] {slo['met_share']:.0%}")
        cells += [short(row["gpu_hours_per_day"]), short(row["energy_kwh_per_day"]),
                  "yes" if row["meets_slos"] else "no"]  # fmt: skip
        if unplaced:
            cells.append(f"{row['unplaceable_share'] or 0:.0%}" if "error" not in row else "")
        rows.append(cells)
    columns = ["", ("#", "right"), "nodes", "policy", "admission", *((n, "right") for n in names),
               ("GPU-h/day", "right"), ("kWh/day", "right"), "meets"]  # fmt: skip
    if unplaced:
        columns.append(("unplaced", "right"))
    output.show(output.table(columns, rows))
    output.say(
        "each SLO: attainment, mean [p10,p90] over the runs, then the share of runs that met it"
        + ("; unplaced: the jobs no node of the scenario can hold (it then meets no SLO)" if unplaced else "")
    )
    best = doc["cheapest"]
    if best is None:
        output.say("no scenario meets the SLOs: widen the ranges or relax --confidence")
    else:
        nodes = ", ".join(f"{n} x {gpu}" for gpu, n in best["nodes"].items())
        output.say(
            f"cheapest: {nodes} nodes, {best['policy']}, admission {best['admission']}: "
            f"{short(best['gpu_hours_per_day'])} GPU-h/day, {short(best['energy_kwh_per_day'])} kWh/day"
        )


def _short(gpu: str) -> str:
    from twin.domain import gpu_type

    try:
        return gpu_type(gpu).short
    except KeyError:
        return gpu
