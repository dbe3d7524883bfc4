"""`finetwin forecast`, `simulate`, `whatif` and `backtest`: thin handlers over the twin.

Registration imports argparse only. Handlers get models and benchmark tables through the composition
root (`twin.cli`), never from calibrate directly.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twin.settings import Settings

if TYPE_CHECKING:
    from twin.protocols import JobModels

log = logging.getLogger("finetwin.twin")

POLICIES = ("fifo", "backfill", "spf")
ADMISSIONS = ("off", "reject", "repair")
OPTIMIZATIONS = ("fast_kernels", "roce", "fast_moe")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    forecast = subparsers.add_parser(
        "forecast",
        help="forecast the cluster from its live state (ensemble of seeded runs)",
        description="Start from the store's nodes, queued and running jobs, draw future arrivals from the "
        "observed arrival process, and report mean and p10/p90 across runs: queue, waits, utilization by "
        "GPU type, completions, failed GPU-hours, energy and SLO attainment.",
    )
    forecast.add_argument("--horizon", default=None, help="how far ahead, e.g. 24h (default from settings)")
    _ensemble_arguments(forecast, runs=None)
    forecast.add_argument("--store", action="store_true", help="also store it in the database")
    forecast.add_argument(
        "--skill", action="store_true",
        help="instead: how the stored forecasts did against what happened (error and p10-p90 coverage)",
    )  # fmt: skip
    forecast.add_argument(
        "--since",
        default=None,
        help="with --skill: intervals from this RFC 3339 time, or this long back (24h)",
    )
    forecast.set_defaults(handler=run_forecast_command)

    simulate = subparsers.add_parser(
        "simulate",
        help="run the twin on an explicit cluster and workload",
        description="CLUSTER.yaml is `nodes: [{gpu_model, count, gpus_per_node}]`; JOBS.csv has job_id, "
        "arrival_s, gpus and either duration_s or a benchmark configuration with dataset_tokens.",
    )
    simulate.add_argument("--cluster", type=Path, required=True, metavar="CLUSTER.yaml")
    simulate.add_argument("--workload", type=Path, required=True, metavar="JOBS.csv")
    simulate.add_argument("--horizon", default=None, help="stop at this time (default: when every job ended)")
    _ensemble_arguments(simulate, runs=1)
    simulate.set_defaults(handler=run_simulate_command)

    whatif = subparsers.add_parser(
        "whatif",
        help="compare a scenario with the baseline forecast (paired seeds)",
        description="SCENARIO.yaml: name, horizon, runs, seed, policy, admission, changes: {nodes: "
        "[{gpu_model, add|remove}], policy, admission, optimizations: [fast_kernels, roce, fast_moe], "
        "right_size_batches}; optional cluster: FILE and workload: FILE instead of the live state.",
    )
    whatif.add_argument("scenario", type=Path, metavar="SCENARIO.yaml")
    whatif.add_argument("--workers", type=int, default=None, help="processes (default: by ensemble size)")
    _models_argument(whatif)
    whatif.add_argument("--json", action="store_true", help="print JSON")
    whatif.set_defaults(handler=run_whatif_command)

    backtest = subparsers.add_parser(
        "backtest",
        help="compare the twin's forecast with what happened: a benchmark replay, or the store's telemetry",
        description="--bench: every benchmark row becomes a job arriving by a seeded Poisson process; the "
        "twin, started at the window's start, forecasts jobs completed, GPU-hours, mean wait, makespan and "
        "energy of the window's jobs from the models, and is compared with the replay of the measured runs. "
        "--from-store --at T --horizon H: the cluster's state at telemetry time T is rebuilt from the stored "
        "events and forecast with the model version in use at T, against what the store recorded after T.",
    )
    backtest.add_argument("--bench", type=Path, default=None, metavar="FILE", help="benchmark CSV")
    backtest.add_argument(
        "--from-store", action="store_true", help="backtest the store's telemetry (with --at, --horizon)"
    )
    backtest.add_argument("--at", default=None, metavar="T", help="--from-store: RFC 3339 telemetry time")
    backtest.add_argument("--horizon", default=None, metavar="H", help="--from-store: how far, e.g. 6h")
    backtest.add_argument(
        "--arrivals", choices=("observed", "model"), default="observed",
        help="--from-store: the jobs submitted after T as they came (default), or drawn as a forecast would",
    )  # fmt: skip
    backtest.add_argument("--window", default=None, help="START:END on the replay's clock, e.g. 0:24h (all)")
    backtest.add_argument("--cluster", type=Path, default=None, metavar="CLUSTER.yaml")
    backtest.add_argument("--load", type=float, default=0.7, help="offered load of the arrivals (0.7)")
    backtest.add_argument("--policy", choices=POLICIES, default="fifo")
    backtest.add_argument("--runs", type=int, default=8)
    backtest.add_argument("--seed", type=int, default=0)
    backtest.add_argument("--workers", type=int, default=None)
    backtest.add_argument(
        "--models", type=Path, default=None, metavar="DIR",
        help="use the models in use under DIR (default: calibrate on --bench itself)",
    )  # fmt: skip
    backtest.add_argument("--json", action="store_true", help="print JSON")
    backtest.set_defaults(handler=run_backtest_command)

    migrate = subparsers.add_parser(
        "migrate",
        help="bring the store's schema to the newest version (run as the role that owns the schema)",
        description="Applies the pending migrations to FINETWIN_DATABASE_URL. In production this runs as the "
        "schema's owner, and the services connect as a role that owns nothing (docs/advisor.md).",
    )
    migrate.set_defaults(handler=run_migrate_command)


def _models_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models", type=Path, default=None, metavar="DIR",
        help="model registry directory (default FINETWIN_MODELS_DIR or DATA_DIR/models)",
    )  # fmt: skip


def _ensemble_arguments(parser: argparse.ArgumentParser, runs: int | None) -> None:
    parser.add_argument("--interval", default=None, help="width of one step of the series (default 1h)")
    parser.add_argument("--runs", type=int, default=runs, help="seeded runs in the ensemble")
    parser.add_argument("--seed", type=int, default=None, help="seed of the ensemble")
    parser.add_argument("--policy", choices=POLICIES, default=None, help="scheduling policy")
    parser.add_argument("--admission", choices=ADMISSIONS, default=None, help="admission control")
    parser.add_argument(
        "--optimize", choices=OPTIMIZATIONS, action="append", default=[], help="switch on (repeatable)"
    )
    parser.add_argument("--workers", type=int, default=None, help="processes (default: by ensemble size)")
    _models_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")


# --- handlers


def run_migrate_command(args: argparse.Namespace, settings: Settings) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from twin.cli import CommandError
    from twin.db import engine_from_settings, migrate

    engine = engine_from_settings(settings)
    where = engine.url.render_as_string(hide_password=True)
    try:
        migrate(engine)
    except SQLAlchemyError as exc:
        raise CommandError(f"cannot migrate {where}: {exc}") from None
    finally:
        engine.dispose()
    print(f"{where}: schema up to date")
    return 0


def run_forecast_command(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import timedelta

    from twin.cli import CommandError
    from twin.clock import twin_clock
    from twin.db import engine_from_settings, migrate
    from twin.forecast import forecast
    from twin.forecast_store import ON_DEMAND, save_forecast
    from twin.live_state import NoClusterError, load_live_inputs

    engine = engine_from_settings(settings)
    migrate(engine)
    clock = twin_clock(engine, settings.cluster_id, tolerance_s=settings.forecast_clock_tolerance_seconds)
    if args.skill:
        return _print_skill(engine, settings, clock.now, args.since, args.json)
    options = _options(args, settings, default_horizon=f"{settings.forecast_horizon_hours}h")
    slos = _slos(settings)
    try:
        inputs = load_live_inputs(
            engine,
            cluster_id=settings.cluster_id,
            lookback=timedelta(days=settings.forecast_lookback_days),
            clock=clock,
        )
    except NoClusterError as exc:
        raise CommandError(str(exc)) from None
    models, source = _job_models(args, settings, needed=_needs_models(inputs))
    with _progress(options.runs, "forecast", args.json) as tick:
        document = forecast(inputs, models, options, slos, model_source=source, progress=tick)
    if args.store:
        save_forecast(engine, document, cluster_id=settings.cluster_id, kind=ON_DEMAND)
    _emit(document, args.json, _print_forecast)
    return 0


def _print_skill(engine: Any, settings: Settings, now: Any, since_text: str | None, as_json: bool) -> int:
    from datetime import datetime, timedelta

    from twin.cli import CommandError
    from twin.skill import skill
    from twin.units import parse_duration

    since = None
    if since_text:
        try:
            since = now - timedelta(seconds=parse_duration(since_text))
        except ValueError:
            try:
                since = datetime.fromisoformat(since_text.replace("Z", "+00:00"))
            except ValueError:
                raise CommandError(f"--since: not a time or a duration: {since_text!r}") from None
    document = skill(engine, settings.cluster_id, since)
    if as_json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"{document['scored']} forecasts scored over {document['intervals']} interval figures")
    print(f"{'figure':<44} {'n':>6} {'MAPE':>8} {'MAE':>10} {'bias':>10} {'p10-p90 coverage':>17}")
    for figure, stats in document["figures"].items():
        mape = "-" if stats["mape"] is None else f"{100 * stats['mape']:.1f}%"
        print(
            f"{figure:<44} {stats['n']:>6} {mape:>8} {stats['mae']:>10.3g} {stats['bias']:>10.3g} "
            f"{stats['coverage']:>17.2f}"
        )
    return 0


def run_simulate_command(args: argparse.Namespace, settings: Settings) -> int:
    from twin.forecast import TwinInputs, forecast

    cluster, workload = _explicit_inputs(args.cluster, args.workload)
    options = _options(args, settings, default_horizon=None).with_changes(keep_jobs=True)
    inputs = TwinInputs(cluster=cluster, workload=workload)
    models, source = _job_models(args, settings, needed=_needs_models(inputs))
    with _progress(options.runs, "simulate", args.json) as tick:
        document = _checked(lambda: forecast(inputs, models, options, _slos(settings), source, tick))
    _emit(document, args.json, _print_forecast)
    return 0


def run_whatif_command(args: argparse.Namespace, settings: Settings) -> int:
    from datetime import timedelta

    import yaml
    from pydantic import ValidationError

    from twin.cli import CommandError
    from twin.db import engine_from_settings, migrate
    from twin.forecast import TwinInputs
    from twin.live_state import NoClusterError, load_live_inputs
    from twin.whatif import WhatIf, run_whatif

    try:
        spec = yaml.safe_load(args.scenario.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"{args.scenario}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CommandError(f"{args.scenario}: not valid YAML: {exc}") from None
    if not isinstance(spec, dict):
        raise CommandError(f"{args.scenario}: expected a mapping (name, horizon, runs, changes, ...)")
    cluster_file, workload_file = spec.pop("cluster", None), spec.pop("workload", None)
    try:
        whatif = WhatIf.model_validate(spec)
    except ValidationError as exc:
        raise CommandError(f"{args.scenario}: {_first_error(exc)}") from None
    if (cluster_file is None) != (workload_file is None):
        raise CommandError(f"{args.scenario}: give both cluster and workload files, or neither (live state)")
    if cluster_file is not None:
        base = args.scenario.parent
        inputs = TwinInputs(*_explicit_inputs(base / str(cluster_file), base / str(workload_file)))
    else:
        engine = engine_from_settings(settings)
        migrate(engine)
        try:
            inputs = load_live_inputs(
                engine,
                cluster_id=settings.cluster_id,
                lookback=timedelta(days=settings.forecast_lookback_days),
            )
        except NoClusterError as exc:
            raise CommandError(str(exc)) from None
    models, source = _job_models(args, settings, needed=_needs_models(inputs))
    with _progress(2 * whatif.runs, "what-if", args.json) as tick:
        document = _checked(
            lambda: run_whatif(
                inputs,
                models,
                whatif,
                _slos(settings),
                workers=args.workers,
                model_source=source,
                progress=tick,
                ray_address=settings.ray_address,
            )
        )
    _emit(document, args.json, _print_whatif)
    return 0


def run_backtest_command(args: argparse.Namespace, settings: Settings) -> int:
    from twin.backtest import parse_window, run_backtest
    from twin.cli import CommandError, fit_benchmark_models, load_benchmark_table
    from twin.cluster import ClusterFormatError, load_cluster
    from twin.policies import Policy

    if args.from_store:
        return _backtest_from_store(args, settings)
    if args.bench is None:
        raise CommandError("give --bench FILE, or --from-store --at T --horizon H")

    try:
        window = parse_window(args.window)
    except ValueError as exc:
        raise CommandError(f"--window: {exc}") from None
    if args.runs < 1:
        raise CommandError("--runs must be at least 1")
    try:
        table = load_benchmark_table(args.bench)
    except ValueError as exc:  # BenchmarkFormatError names the file, line and column
        raise CommandError(str(exc)) from None
    try:
        cluster = load_cluster(args.cluster) if args.cluster is not None else None
    except ClusterFormatError as exc:
        raise CommandError(str(exc)) from None
    if args.models is not None:
        models, source = _job_models(args, settings, needed=True)
    else:
        try:
            models, source = (
                fit_benchmark_models(args.bench, seed=args.seed),
                f"calibrated on {args.bench.name}",
            )
        except ModuleNotFoundError as exc:
            raise CommandError(
                f"cannot calibrate models here ({exc.name} is not available): give --models DIR"
            ) from None
    with _progress(args.runs, "backtest", args.json) as tick:
        document = _checked(
            lambda: run_backtest(
                table, models, cluster=cluster, window=window, policy=Policy(args.policy), runs=args.runs,
                seed=args.seed, load=args.load, workers=args.workers, model_source=source, progress=tick,
                ray_address=settings.ray_address,
            )
        )  # fmt: skip
    _emit(document, args.json, _print_backtest)
    return 0


# --- parts


def _options(args: argparse.Namespace, settings: Settings, default_horizon: str | None) -> Any:
    from twin.cli import CommandError
    from twin.config_changes import Admission, Optimization
    from twin.forecast import ForecastOptions
    from twin.plan import PlanOptions
    from twin.policies import Policy
    from twin.units import parse_duration

    try:
        horizon_text = args.horizon if args.horizon is not None else default_horizon
        horizon = parse_duration(horizon_text) if horizon_text is not None else None
        interval = (
            parse_duration(args.interval)
            if args.interval is not None
            else settings.forecast_interval_minutes * 60.0
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    runs = args.runs if args.runs is not None else settings.forecast_runs
    if runs < 1:
        raise CommandError("--runs must be at least 1")
    return ForecastOptions(
        horizon_s=horizon,
        interval_s=interval,
        runs=runs,
        seed=args.seed if args.seed is not None else settings.forecast_seed,
        policy=Policy(args.policy or settings.forecast_policy),
        plan=PlanOptions(
            admission=Admission(args.admission or settings.forecast_admission),
            optimizations=frozenset(Optimization(o) for o in args.optimize),
        ),
        workers=args.workers if args.workers is not None else settings.forecast_workers,
        ray_address=settings.ray_address,
    )


def _slos(settings: Settings) -> Any:
    from twin.cli import CommandError
    from twin.slo_attainment import SloFormatError, load_slos

    try:
        return load_slos(settings.slo_file)
    except SloFormatError as exc:
        raise CommandError(str(exc)) from None


def _explicit_inputs(cluster_path: Path, workload_path: Path) -> tuple[Any, Any]:
    from twin.cli import CommandError
    from twin.cluster import ClusterFormatError, load_cluster
    from twin.workload import WorkloadFormatError, read_jobs_csv

    try:
        return load_cluster(cluster_path), read_jobs_csv(workload_path)
    except (ClusterFormatError, WorkloadFormatError) as exc:
        raise CommandError(str(exc)) from None


def _needs_models(inputs: Any) -> bool:
    from twin.workload import NO_CONFIG

    if (inputs.workload.config_idx != NO_CONFIG).any():
        return True
    return inputs.arrivals is not None and bool((inputs.arrivals.mix.config_idx != NO_CONFIG).any())


def _job_models(args: argparse.Namespace, settings: Settings, needed: bool) -> tuple[JobModels | None, str]:
    """The calibrated models in use; the uncalibrated fallback (with a warning) when none has been fitted."""
    from twin.cli import CommandError, load_job_models
    from twin.uncalibrated import FallbackModels

    if not needed:
        return None, "none (fixed durations)"
    try:
        models = load_job_models(settings, args.models)
    except ModuleNotFoundError as exc:
        log.warning("calibrated models unavailable (%s): using the uncalibrated fallback", exc.name)
        return FallbackModels(), "fallback"
    except Exception as exc:  # the registry refuses a tampered or unreadable version: say so, do not guess
        raise CommandError(f"the models in use cannot be loaded: {exc}") from None
    if models is None:
        if args.models is not None:
            raise CommandError(f"no calibrated model in use under {args.models} (run finetwin calibrate)")
        log.warning("no calibrated model in use yet: forecasting with the uncalibrated fallback")
        return FallbackModels(), "fallback"
    return models, "calibrated"


def _checked(work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Runs the twin; a problem with the inputs (a job without work, a scenario removing every node) is
    the user's to fix: a message, not a traceback."""
    from twin.cli import CommandError

    try:
        return work()
    except ValueError as exc:
        raise CommandError(str(exc)) from None


class _progress:
    """A progress bar on stderr for interactive use (silent in pipes and with --json)."""

    def __init__(self, total: int, what: str, quiet: bool) -> None:
        self.total, self.what, self.quiet = total, what, quiet or not sys.stderr.isatty()
        self.bar: Any = None

    def __enter__(self) -> Callable[[], object] | None:
        if self.quiet:
            return None
        from tqdm import tqdm

        self.bar = tqdm(total=self.total, desc=self.what, unit="run", file=sys.stderr, leave=False)
        return self.bar.update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _first_error(exc: Any) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', 'invalid')}"


def _emit(document: dict[str, Any], as_json: bool, printer: Callable[[dict[str, Any]], None]) -> None:
    if as_json:
        json.dump(document, sys.stdout, default=_json_default, allow_nan=False)
        sys.stdout.write("\n")
    else:
        printer(document)


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _print_forecast(doc: dict[str, Any]) -> None:
    horizon = doc.get("horizon_s")
    print(
        f"{doc['runs']} run(s), horizon {'until done' if horizon is None else f'{horizon / 3600:g} h'}, "
        f"policy {doc['policy']}, admission {doc['admission']}, models: {doc['models']}"
    )
    for note in doc.get("notes", []):
        print(f"note: {note}")
    print(f"{'figure':28} {'mean':>12} {'p10':>12} {'p90':>12}")
    rows = [(k, v) for k, v in doc["summary"].items() if k != "utilization_by_type"]
    rows += [(f"utilization {gpu}", v) for gpu, v in doc["summary"].get("utilization_by_type", {}).items()]
    for name, v in rows:
        print(f"{name:28.28} {_fmt(v['mean']):>12} {_fmt(v['p10']):>12} {_fmt(v['p90']):>12}")
    for slo in doc.get("slos", []):
        a = slo["attainment"]
        print(
            f"SLO {slo['name']}: attained in {_fmt(a['mean'])} of intervals "
            f"(p10 {_fmt(a['p10'])}, p90 {_fmt(a['p90'])}), met over the horizon in "
            f"{slo['probability_met']:.0%} of runs"
        )


def _print_whatif(doc: dict[str, Any]) -> None:
    print(f"what-if {doc['name']!r}: {json.dumps(doc['changes'])}")
    print(f"{'figure':24} {'baseline':>12} {'scenario':>12} {'difference':>12}  95% CI")
    for name, diff in doc["difference"].items():
        if name == "slos":
            continue
        base = doc["baseline"]["summary"][name]["mean"]
        scen = doc["scenario"]["summary"][name]["mean"]
        ci = diff.get("ci95") or [None, None]
        interval = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]"
        print(f"{name:24} {_fmt(base):>12} {_fmt(scen):>12} {_fmt(diff['mean']):>12}  {interval}")
    for slo in doc["difference"]["slos"]:
        a = slo["attainment"]
        met = slo["probability_met"]
        print(f"SLO {slo['name']}: attainment {_fmt(a['mean'])} (CI {a['ci95']}), P(met) {met:+.0%}")


def _backtest_from_store(args: argparse.Namespace, settings: Settings) -> int:
    """Thin: parse, pick the model version that was in use at T, hand over to twin.store_backtest."""
    from datetime import datetime

    from twin.cli import CommandError, load_job_models_at
    from twin.clock import as_utc
    from twin.db import engine_from_settings, migrate
    from twin.policies import Policy
    from twin.store_backtest import backtest_from_store
    from twin.units import parse_duration

    if args.at is None or args.horizon is None:
        raise CommandError("--from-store needs --at T (RFC 3339) and --horizon H (e.g. 6h)")
    try:
        at = as_utc(datetime.fromisoformat(args.at.strip().replace("Z", "+00:00")))
    except ValueError:
        raise CommandError(f"--at: not an RFC 3339 time: {args.at!r}") from None
    try:
        horizon = parse_duration(args.horizon)
    except ValueError as exc:
        raise CommandError(f"--horizon: {exc}") from None
    if args.runs < 1:
        raise CommandError("--runs must be at least 1")
    try:
        loaded = load_job_models_at(settings, at, args.models)
    except Exception as exc:  # the registry refuses a tampered or unreadable version: say so
        raise CommandError(f"the model version in use at {at.isoformat()} cannot be loaded: {exc}") from None
    if loaded is None:
        raise CommandError(
            f"no model version was in use at {at.isoformat()} (or every one then was fitted on later data)"
        )
    version, models = loaded
    engine = engine_from_settings(settings)
    migrate(engine)
    with _progress(args.runs, "backtest", args.json) as tick:
        document = _checked(
            lambda: backtest_from_store(
                engine, models, at=at, horizon_s=horizon, cluster_id=settings.cluster_id, runs=args.runs,
                seed=args.seed, policy=Policy(args.policy), arrivals=args.arrivals, workers=args.workers,
                model_source=f"calibrated {version} (in use at {at.isoformat()})", progress=tick,
            )
        )  # fmt: skip
    _emit(document, args.json, _print_store_backtest)
    return 0


def _print_store_backtest(doc: dict[str, Any]) -> None:
    print(
        f"backtest from the store at {doc['at']} over {doc['horizon_s']:g} s: {doc['jobs_in_window']} jobs, "
        f"{doc['runs']} run(s), arrivals {doc['arrivals']}, models: {doc['models']}"
    )
    _print_figures(doc)


def _print_figures(doc: dict[str, Any]) -> None:
    print(f"{'figure':18} {'truth':>12} {'twin mean':>12} {'p10':>12} {'p90':>12} {'error':>8}")
    for name, f in doc["figures"].items():
        error = "-" if f["error"] is None else f"{f['error']:+.1%}"
        t = f["twin"]
        spread = f"{_fmt(t['mean']):>12} {_fmt(t['p10']):>12} {_fmt(t['p90']):>12}"
        print(f"{name:18} {_fmt(f['truth']):>12} {spread} {error:>8}")


def _print_backtest(doc: dict[str, Any]) -> None:
    print(
        f"backtest: {doc['jobs_in_window']} of {doc['jobs_in_benchmark']} jobs in the window, "
        f"{doc['runs']} run(s), policy {doc['policy']}, models: {doc['models']}"
    )
    _print_figures(doc)
