"""`finetwin forecast`, `simulate`, `whatif` and `backtest`: the twin's forecasts, from the live state or
from explicit files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from finetwin import output
from finetwin.commands import add_command, twin_output
from finetwin.commands.options import (
    BUNDLED,
    Json,
    ModelsDir,
    bench_option,
    refuse_options,
    validation_message,
)
from finetwin.commands.twin_inputs import (
    AdmissionName,
    EnsembleChoices,
    OptimizationName,
    PolicyName,
    checked,
    checked_runs,
    checked_seed,
    checked_workers,
    declared_slos,
    explicit_inputs,
    forecast_options,
    job_models,
    live_inputs,
    needs_models,
)
from finetwin.errors import CommandError
from finetwin.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy import Engine

Interval = Annotated[str | None, typer.Option(help="width of one step of the series (default 1h)")]
Runs = Annotated[int | None, typer.Option(help="seeded runs in the ensemble")]
EnsembleSeed = Annotated[int | None, typer.Option(help="seed of the ensemble")]
PolicyChoice = Annotated[PolicyName | None, typer.Option(help="scheduling policy")]
AdmissionChoice = Annotated[AdmissionName | None, typer.Option(help="admission control")]
Optimize = Annotated[list[OptimizationName] | None, typer.Option(help="switch on (repeatable)")]
Workers = Annotated[int | None, typer.Option(help="processes (default: by ensemble size)")]

# The options of `forecast` that make a forecast: `forecast --skill` scores the stored ones, and has none.
FORECAST_ONLY = (
    "horizon", "interval", "runs", "seed", "policy", "admission", "optimize", "workers", "models", "store",
)  # fmt: skip
SKILL_ONLY = ("since",)
# `backtest --bench` replays a benchmark file on a cluster; `--from-store` rebuilds the store's state at T.
BENCH_BACKTEST_ONLY = ("bench", "window", "cluster", "load")
STORE_BACKTEST_ONLY = ("at", "horizon", "arrivals", "which_policy")
# What the policy comparison (--which-policy) does not use: each policy runs once, on recorded run times.
ENSEMBLE_ONLY = ("policy", "runs", "workers", "arrivals")


def register(app: typer.Typer) -> None:
    add_command(
        app,
        forecast,
        "forecast",
        help="forecast the cluster from its live state (ensemble of seeded runs)",
        epilog="Start from the store's nodes, queued and running jobs, draw future arrivals from the "
        "observed arrival process, and report mean and p10/p90 across runs: queue, waits, utilization by "
        "GPU type, completions, failed GPU-hours, energy and SLO attainment.",
    )
    add_command(
        app,
        simulate,
        "simulate",
        help="run the twin on an explicit cluster and workload",
        epilog="CLUSTER.yaml is `nodes: [{gpu_model, count, gpus_per_node}]`; JOBS.csv has job_id, "
        "arrival_s, gpus (or number_gpus: the same count) and either duration_s or a benchmark configuration "
        "with dataset_tokens.",
    )
    add_command(
        app,
        whatif,
        "whatif",
        help="compare a scenario with the baseline forecast (paired seeds)",
        # Brackets escaped: rich read "[fast_kernels, roce, fast_moe]" as a style and printed nothing.
        epilog="SCENARIO.yaml (docs/input-files.md): name, horizon, interval, runs, seed, policy, admission, "
        "changes: {nodes: \\[{gpu_model, add|remove, gpus_per_node}], policy, admission, "
        "optimizations: \\[fast_kernels, roce, fast_moe], right_size_batches}; optional cluster: FILE and "
        "workload: FILE instead of the live state.",
    )
    add_command(
        app,
        backtest,
        "backtest",
        help="compare the twin's forecast with what happened: a benchmark replay, or the store's telemetry",
        epilog="--bench: every benchmark row becomes a job arriving by a seeded Poisson process; the twin, "
        "started at the window's start, forecasts jobs completed, GPU-hours, mean wait, makespan and energy "
        "of the window's jobs from the models, and is compared with the replay of the measured runs. "
        "--from-store --at T --horizon H: the cluster's state at telemetry time T is rebuilt from the stored "
        "events and forecast with the model version in use at T, against what the store recorded after T.",
    )


def forecast(
    ctx: typer.Context,
    horizon: Annotated[
        str | None, typer.Option(help="how far ahead, e.g. 24h (default FINETWIN_FORECAST_HORIZON_HOURS: 24)")
    ] = None,
    interval: Annotated[
        str | None,
        typer.Option(help="width of one step of the series (default FINETWIN_FORECAST_INTERVAL_MINUTES: 60)"),
    ] = None,
    runs: Annotated[
        int | None, typer.Option(help="seeded runs in the ensemble (default FINETWIN_FORECAST_RUNS: 32)")
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="seed of the ensemble (default FINETWIN_FORECAST_SEED: 0)")
    ] = None,
    policy: Annotated[
        PolicyName | None,
        typer.Option(
            help="scheduling policy (default FINETWIN_FORECAST_POLICY: fifo; `up` forecasts the cluster it "
            "replays with backfill, the policy closest to how that cluster schedules)"
        ),
    ] = None,
    admission: Annotated[
        AdmissionName | None,
        typer.Option(help="admission control (default FINETWIN_FORECAST_ADMISSION: off)"),
    ] = None,
    optimize: Optimize = None,
    workers: Workers = None,
    models: ModelsDir = None,
    as_json: Json = False,
    store: Annotated[bool, typer.Option("--store", help="also store it in the database")] = False,
    skill: Annotated[
        bool,
        typer.Option(
            "--skill",
            help="instead: how the stored forecasts did against what happened (error and p10-p90 coverage); "
            "takes --since and --json only",
        ),
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="with --skill: intervals from this RFC 3339 time, or this long back (24h)"),
    ] = None,
) -> int:
    from finetwin.wiring import migrated_engine
    from twin.clock import cluster_clock
    from twin.forecast import forecast as run_forecast
    from twin.forecast_store import ON_DEMAND, save_forecast

    settings: Settings = ctx.obj
    if skill:
        refuse_options(
            ctx, FORECAST_ONLY, "to a forecast, not with --skill (how the stored forecasts did)",
            "drop --skill to forecast, or leave {options} out",
        )  # fmt: skip
    else:
        refuse_options(
            ctx, SKILL_ONLY, "with --skill (how the stored forecasts did)",
            "add --skill, or leave {options} out",
        )  # fmt: skip
    engine = migrated_engine(settings)
    clock = cluster_clock(engine, settings)
    if skill:
        return _skill(engine, settings, clock.now, since, as_json)
    choices = EnsembleChoices(horizon, interval, runs, seed, policy, admission, optimize or [], workers)
    options = forecast_options(choices, settings, default_horizon=f"{settings.forecast_horizon_hours}h")
    slos = declared_slos(settings, engine)
    engine, inputs = live_inputs(settings, engine, clock)
    job_models_, source = job_models(models, settings, needed=needs_models(inputs))
    with output.progress(options.runs, "forecast", "runs", quiet=as_json) as tick:
        document = run_forecast(inputs, job_models_, options, slos, model_source=source, progress=tick)
    if settings.forecast_band_calibration:
        from twin.band_calibration import calibrated_forecast

        window = timedelta(days=settings.forecast_lookback_days)
        document = calibrated_forecast(engine, settings.cluster_id, document, window)
    if store:
        save_forecast(engine, document, cluster_id=settings.cluster_id, kind=ON_DEMAND)
    twin_output.emit(document, as_json, twin_output.print_forecast)
    return 0


def _skill(engine: object, settings: Settings, now: datetime, since_text: str | None, as_json: bool) -> int:
    """How the stored forecasts did against what the store then recorded (twin.skill)."""
    from twin.skill import since_time, skill

    since = None
    if since_text:
        try:
            since = since_time(since_text, now)
        except ValueError as exc:
            raise CommandError(f"--since: {exc}") from None
    document = skill(engine, settings.cluster_id, since)
    record = _slos_record(engine, settings, now, since)
    if as_json:
        print(json.dumps(document | {"slos_as_they_happened": record}, indent=2, default=str))
    else:
        twin_output.print_skill(document, settings.store_description(), settings.cluster_id)
        if record is not None:
            twin_output.print_slos_record(record)
    return 0


def _slos_record(
    engine: Any, settings: Settings, now: datetime, since: datetime | None
) -> dict[str, Any] | None:
    """The SLOs in force judged on the record since `since` (24 h without; 31 days at most): what the
    forecasts' attainment is read against (`GET /v1/slos/attainment`). None for a window that holds none."""
    from twin.slo_actual import MAX_WINDOW_S, slos_as_they_happened, window_problem

    window_s = 86400.0 if since is None else min((now - since).total_seconds(), MAX_WINDOW_S)
    interval_s = settings.forecast_interval_minutes * 60.0
    if window_problem(window_s, interval_s) is not None:
        return None
    slos = declared_slos(settings, engine)
    return slos_as_they_happened(engine, settings.cluster_id, slos, now, window_s, interval_s)


def simulate(
    ctx: typer.Context,
    cluster: Annotated[Path, typer.Option(metavar="CLUSTER.yaml")],
    workload: Annotated[Path, typer.Option(metavar="JOBS.csv")],
    horizon: Annotated[
        str | None, typer.Option(help="stop at this time (default: when every job ended)")
    ] = None,
    interval: Interval = None,
    runs: Runs = 1,
    seed: EnsembleSeed = None,
    policy: PolicyChoice = None,
    admission: AdmissionChoice = None,
    optimize: Optimize = None,
    workers: Workers = None,
    models: ModelsDir = None,
    as_json: Json = False,
) -> int:
    from twin.forecast import TwinInputs
    from twin.forecast import forecast as run_forecast

    settings: Settings = ctx.obj
    nodes, jobs = explicit_inputs(cluster, workload)
    choices = EnsembleChoices(horizon, interval, runs, seed, policy, admission, optimize or [], workers)
    options = forecast_options(choices, settings, default_horizon=None).with_changes(keep_jobs=True)
    inputs = TwinInputs(cluster=nodes, workload=jobs)
    job_models_, source = job_models(models, settings, needed=needs_models(inputs))
    slos = declared_slos(settings)
    with output.progress(options.runs, "simulate", "runs", quiet=as_json) as tick:
        document = checked(lambda: run_forecast(inputs, job_models_, options, slos, source, tick))
    twin_output.emit(document, as_json, twin_output.print_forecast)
    return 0


def whatif(
    ctx: typer.Context,
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO.yaml")],
    workers: Workers = None,
    models: ModelsDir = None,
    as_json: Json = False,
) -> int:
    from pydantic import ValidationError

    from twin.forecast import TwinInputs
    from twin.text_files import TextFileError, read_yaml
    from twin.whatif import WhatIf, run_whatif

    settings: Settings = ctx.obj
    workers = checked_workers(workers)
    try:
        spec = read_yaml(scenario)
    except TextFileError as exc:
        raise CommandError(str(exc)) from None
    if not isinstance(spec, dict):
        raise CommandError(f"{scenario}: expected a mapping (name, horizon, runs, changes, ...)")
    cluster_file, workload_file = spec.pop("cluster", None), spec.pop("workload", None)
    try:
        what = WhatIf.model_validate(spec)
    except ValidationError as exc:
        wrong = validation_message(exc, WhatIf, also=("cluster", "workload"))  # the two files, read here
        raise CommandError(f"{scenario}: {wrong}") from None
    if (cluster_file is None) != (workload_file is None):
        raise CommandError(f"{scenario}: give both cluster and workload files, or neither (live state)")
    if cluster_file is not None:
        base = scenario.parent
        inputs = TwinInputs(*explicit_inputs(base / str(cluster_file), base / str(workload_file)))
    else:
        _engine, inputs = live_inputs(settings)
    job_models_, source = job_models(models, settings, needed=needs_models(inputs))
    slos = declared_slos(settings)
    with output.progress(2 * what.runs, "what-if", "runs", quiet=as_json) as tick:
        document = checked(
            lambda: run_whatif(
                inputs,
                job_models_,
                what,
                slos,
                workers=workers,
                model_source=source,
                progress=tick,
                ray_address=settings.ray_address,
            )
        )
    twin_output.emit(document, as_json, twin_output.print_whatif)
    return 0


def backtest(
    ctx: typer.Context,
    bench: Annotated[
        Path | None,
        typer.Option(metavar="FILE", callback=bench_option, help=f"benchmark CSV, or {BUNDLED!r}"),
    ] = None,
    window: Annotated[
        str | None, typer.Option(help="--bench: START:END on the replay's clock, e.g. 0:24h (all)")
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(metavar="CLUSTER.yaml", help="--bench: the cluster (default: sized to the file's jobs)"),
    ] = None,
    load: Annotated[float, typer.Option(help="--bench: offered load of the arrivals")] = 0.7,
    policy: Annotated[PolicyName, typer.Option()] = "fifo",
    runs: Annotated[int, typer.Option()] = 8,
    seed: Annotated[int, typer.Option()] = 0,
    workers: Annotated[int | None, typer.Option()] = None,
    models: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR", help="use the models in use under DIR (default: calibrate on --bench itself)"
        ),
    ] = None,
    from_store: Annotated[
        bool, typer.Option("--from-store", help="backtest the store's telemetry (with --at, --horizon)")
    ] = False,
    at: Annotated[
        str | None,
        typer.Option(
            metavar="T",
            help="--from-store: RFC 3339 telemetry time, or a duration back from the newest telemetry (6h)",
        ),
    ] = None,
    horizon: Annotated[str | None, typer.Option(metavar="H", help="--from-store: how far, e.g. 6h")] = None,
    arrivals: Annotated[
        Literal["observed", "model"],
        typer.Option(
            help="--from-store: the jobs submitted after T as they came, or drawn as a forecast would"
        ),
    ] = "observed",
    which_policy: Annotated[
        bool,
        typer.Option(
            "--which-policy",
            help="--from-store: instead of forecasting, run each scheduling policy on the window's jobs with "
            "their recorded run times and say which one schedules as the record does",
        ),
    ] = False,
    as_json: Json = False,
) -> int:
    from finetwin.commands.telemetry import rows_to_replay
    from finetwin.wiring import fit_benchmark_models
    from twin.backtest import parse_window, run_backtest
    from twin.cluster import ClusterFormatError, load_cluster
    from twin.policies import Policy

    settings: Settings = ctx.obj
    if from_store:
        refuse_options(
            ctx, BENCH_BACKTEST_ONLY, "to the benchmark backtest (--bench), not with --from-store",
            "drop --from-store to backtest --bench, or leave {options} out",
        )  # fmt: skip
    else:
        refuse_options(
            ctx, STORE_BACKTEST_ONLY,
            "with --from-store (the store's telemetry), not to the benchmark backtest (--bench)",
            "add --from-store, or leave {options} out",
        )  # fmt: skip
    if which_policy:
        refuse_options(
            ctx, ENSEMBLE_ONLY, "to the twin's forecast, not with --which-policy (each policy runs once)",
            "leave {options} out",
        )  # fmt: skip
    runs, seed, workers = checked_runs(runs), checked_seed(seed), checked_workers(workers)
    if from_store:
        return _backtest_from_store(
            settings, at=at, horizon=horizon, runs=runs, seed=seed, policy=policy, arrivals=arrivals,
            workers=workers, models=models, as_json=as_json, which_policy=which_policy,
        )  # fmt: skip
    if bench is None:
        raise CommandError("give --bench FILE, or --from-store --at T --horizon H")
    try:
        span = parse_window(window)
    except ValueError as exc:
        raise CommandError(f"--window: {exc}") from None
    table = rows_to_replay(bench)
    try:
        nodes = load_cluster(cluster) if cluster is not None else None
    except ClusterFormatError as exc:
        raise CommandError(str(exc)) from None
    if models is not None:
        job_models_, source = job_models(models, settings, needed=True)
    else:
        try:
            job_models_, source = fit_benchmark_models(bench, seed=seed), f"calibrated on {bench.name}"
        except ValueError as exc:  # too few runs of a kind to fit on: was a traceback
            raise CommandError(
                f"cannot calibrate the backtest's models on {bench}: {exc}; give --models DIR to backtest "
                "with a calibrated version instead"
            ) from None
    with output.progress(runs, "backtest", "runs", quiet=as_json) as tick:
        document = checked(
            lambda: run_backtest(
                table, job_models_, cluster=nodes, window=span, policy=Policy(policy), runs=runs,
                seed=seed, load=load, workers=workers, model_source=source, progress=tick,
                ray_address=settings.ray_address,
            )
        )  # fmt: skip
    twin_output.emit(document, as_json, twin_output.print_backtest)
    return 0


def _no_version_at(settings: Settings, when: datetime, models: Path | None) -> str:
    """Why no model version can forecast from `when`, and what the user can do about it."""
    from calibrate.registry import ModelRegistry

    first = ModelRegistry(models or settings.resolved_models_dir()).first_put_in_use()
    if first is None:
        return "no model version has been put in use yet: run `finetwin calibrate` first"
    if when < first:
        return (
            f"no model version was in use at {when.isoformat()}: the first was put in use at "
            f"{first.isoformat()}. A backtest forecasts with the models of its time: choose a T at or "
            "after then (telemetry replayed with an `--epoch` before it cannot be backtested with these "
            "models)"
        )
    return (
        f"no model version in use at {when.isoformat()} can forecast from it: each was fitted on telemetry "
        "dated after it, or is no longer stored"
    )


def _backtest_time(engine: Engine, cluster_id: str, at: str) -> datetime:
    """`--at`, read as `--since` is (`twin.skill.since_time`): an RFC 3339 time (UTC where it names no zone),
    or a duration back from the telemetry's newest time: "6 hours ago" on the cluster's clock, which a
    replay or a backlog puts far from the wall's. Without telemetry, back from the wall clock: the window
    check then says the store holds none."""
    from twin.clock import telemetry_span
    from twin.skill import OutsideCalendar, since_time

    _, latest = telemetry_span(engine, cluster_id)
    try:
        when = since_time(at, latest or datetime.now(UTC))
    except OutsideCalendar as exc:
        raise CommandError(f"--at: {exc}") from None
    except ValueError:
        raise CommandError(
            f"--at: not an RFC 3339 time or a duration back from the newest telemetry (e.g. 6h): {at!r}"
        ) from None
    if when is None:
        raise CommandError(f"--at {at}: reaches back past the year 1")
    return when


def _backtest_from_store(
    settings: Settings, *, at: str | None, horizon: str | None, runs: int, seed: int, policy: str,
    arrivals: str, workers: int | None, models: Path | None, as_json: bool, which_policy: bool,
) -> int:  # fmt: skip
    """Parse, pick the model version that was in use at T, hand over to twin.store_backtest (or, with
    `which_policy`, to twin.policy_fit)."""
    from finetwin.wiring import load_job_models_at, migrated_engine
    from twin.clock import telemetry_span
    from twin.limits import MAX_SIMULATED_SECONDS
    from twin.policies import Policy
    from twin.store_backtest import backtest_from_store, check_window, telemetry_held
    from twin.units import parse_duration

    engine = migrated_engine(settings)
    if at is None or horizon is None:
        held = telemetry_held(settings.cluster_id, *telemetry_span(engine, settings.cluster_id))
        raise CommandError(
            "--from-store needs --at T (RFC 3339, or back from the newest telemetry: 6h) and --horizon H "
            f"(e.g. 2h); {held}"
        )
    when = _backtest_time(engine, settings.cluster_id, at)
    lookback = timedelta(days=settings.forecast_lookback_days)  # the history a live forecast at T reads
    try:
        horizon_s = parse_duration(horizon)
    except ValueError as exc:
        raise CommandError(f"--horizon: {exc}") from None
    if horizon_s > MAX_SIMULATED_SECONDS:  # as a forecast's: past that, T + H was an OverflowError traceback
        raise CommandError(f"--horizon: at most {MAX_SIMULATED_SECONDS / 86400:,.0f} days (ten years)")
    try:  # before the models: a window the store does not cover is the first thing to fix
        check_window(engine, settings.cluster_id, when, when + timedelta(seconds=horizon_s), lookback)
    except OverflowError:  # --at near the calendar's end (year 9999)
        held = telemetry_held(settings.cluster_id, *telemetry_span(engine, settings.cluster_id))
        raise CommandError(f"--at {at} + --horizon {horizon} ends past the year 9999; {held}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    try:
        loaded = load_job_models_at(settings, when, models)
    except Exception as exc:  # the registry refuses a tampered or unreadable version: say so
        raise CommandError(
            f"the model version in use at {when.isoformat()} cannot be loaded: {exc}"
        ) from None
    if loaded is None:
        raise CommandError(_no_version_at(settings, when, models))
    version, job_models_ = loaded
    source = f"calibrated {version} (in use at {when.isoformat()})"
    if which_policy:
        from twin.policy_fit import policy_fit

        document = checked(
            lambda: policy_fit(
                engine, job_models_, at=when, horizon_s=horizon_s, cluster_id=settings.cluster_id, seed=seed,
                lookback=lookback,
            )
        ) | {"models": source, "in_use": settings.forecast_policy}  # fmt: skip
        twin_output.emit(document, as_json, twin_output.print_policy_fit)
        return 0
    with output.progress(runs, "backtest", "runs", quiet=as_json) as tick:
        document = checked(
            lambda: backtest_from_store(
                engine, job_models_, at=when, horizon_s=horizon_s, cluster_id=settings.cluster_id, runs=runs,
                seed=seed, policy=Policy(policy), arrivals=arrivals, workers=workers,
                model_source=source, progress=tick, lookback=lookback,
                ray_address=settings.ray_address,
            )
        )  # fmt: skip
    twin_output.emit(document, as_json, twin_output.print_store_backtest)
    return 0
