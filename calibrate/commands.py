"""`finetwin calibrate`, `finetwin predict` and `finetwin models list | show | promote | rollback`.

Registration imports argparse only; each handler imports what it needs and calls into the package.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from twin.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    calibrate = subparsers.add_parser(
        "calibrate",
        help="fit the throughput and failure models and write a new model version",
        description="Fit both models on benchmark CSVs (and the runs observed through telemetry), write a "
        "new version under --models, and put it in use only if its held-out metrics are not worse.",
    )
    calibrate.add_argument(
        "--bench", type=Path, action="append", default=[], metavar="FILE", help="benchmark CSV (repeatable)"
    )
    calibrate.add_argument("--observed", action="store_true", help="add the runs observed in the store")
    _models_argument(calibrate)
    calibrate.add_argument("--seed", type=int, default=0, help="seed of the fit and the held-out split")
    calibrate.set_defaults(handler=run_calibrate)

    predict = subparsers.add_parser(
        "predict",
        help="predict outcome and throughput for a CSV of configurations",
        description="Read a CSV with the benchmark's configuration columns and write the same rows with "
        "outcome, rule, p_valid, tokens_per_second_p10/p50/p90 and note added.",
    )
    _models_argument(predict)
    predict.add_argument("--input", type=Path, required=True, metavar="CONFIGS.csv")
    predict.add_argument("--output", type=Path, required=True, metavar="PRED.csv")
    predict.set_defaults(handler=run_predict)

    models = subparsers.add_parser("models", help="list, show, promote or roll back model versions")
    actions = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="every version, its held-out metrics, the one in use")
    _models_argument(listing)
    listing.set_defaults(handler=run_models_list)
    show = actions.add_parser("show", help="one version's metadata (default: the one in use), verified")
    show.add_argument("version", nargs="?", help="e.g. v0003")
    _models_argument(show)
    show.set_defaults(handler=run_models_show)
    promote = actions.add_parser("promote", help="put a version in use if it is not worse than the current")
    promote.add_argument("version", help="e.g. v0003")
    promote.add_argument("--force", action="store_true", help="promote even if its metrics are worse")
    _models_argument(promote)
    promote.set_defaults(handler=run_models_promote)
    rollback = actions.add_parser("rollback", help="back to the version in use before the current one")
    _models_argument(rollback)
    rollback.set_defaults(handler=run_models_rollback)


def _models_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models", type=Path, default=None, metavar="DIR",
        help="model registry directory (default FINETWIN_MODELS_DIR or DATA_DIR/models)",
    )  # fmt: skip


def _models_dir(args: argparse.Namespace, settings: Settings) -> Path:
    return args.models if args.models is not None else settings.resolved_models_dir()


def run_calibrate(args: argparse.Namespace, settings: Settings) -> int:
    from calibrate.dataset import WeightPolicy
    from calibrate.loader import BenchmarkFormatError
    from calibrate.refit import calibrate_version
    from twin.cli import CommandError

    if not args.bench and not args.observed:
        raise CommandError("nothing to fit on: give --bench FILE (repeatable) and/or --observed")
    engine = None
    if args.observed:
        from twin.db import engine_from_settings, migrate

        engine = engine_from_settings(settings)
        migrate(engine)
    try:
        result = calibrate_version(
            _models_dir(args, settings),
            benchmarks=args.bench,
            engine=engine,
            observed=args.observed,
            weights=WeightPolicy(settings.observed_weight, settings.observed_half_life_days),
            tolerance=settings.promote_tolerance,
            reason="finetwin calibrate",
            seed=args.seed,
        )
    except BenchmarkFormatError as exc:
        raise CommandError(f"bad benchmark: {exc}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    finally:
        if engine is not None:
            engine.dispose()
    print(result.message)
    data = result.metadata.get("data", {})
    print("rows: " + ", ".join(f"{k} {v}" for k, v in data.get("rows_by_source", {}).items()))
    comparison = result.comparison
    if comparison is not None:
        print(f"held-out ({comparison.test_rows} rows, basis: {comparison.basis}):")
        print(_metrics_table(comparison.candidate, comparison.incumbent, comparison.against))
    return 0


def run_predict(args: argparse.Namespace, settings: Settings) -> int:
    from calibrate.loader import BenchmarkFormatError
    from calibrate.predict import data_row_number, read_configs, write_predictions
    from calibrate.registry import ModelRegistry, RegistryError
    from twin.cli import CommandError

    try:
        configs = read_configs(args.input)  # bad input is reported before the models are loaded
    except BenchmarkFormatError as exc:
        row = data_row_number(Path(exc.path), exc.line) if exc.line and exc.line > 1 else None
        where = f" (data row {row})" if row else ""
        raise CommandError(f"bad input: {exc}{where}") from None
    models_dir = _models_dir(args, settings)
    try:
        loaded = ModelRegistry(models_dir).load_in_use()
    except RegistryError as exc:
        raise CommandError(str(exc)) from None
    if loaded is None:
        raise CommandError(f"no model version is in use in {models_dir}; run `finetwin calibrate` first")
    version, models = loaded
    summary = write_predictions(models, configs, args.output)
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items()))
    print(
        f"{summary.rows} rows predicted with {version} -> {args.output} ({outcomes}; {summary.flagged} noted)"
    )
    return 0


def run_models_list(args: argparse.Namespace, settings: Settings) -> int:
    from calibrate.registry import ModelRegistry

    registry = ModelRegistry(_models_dir(args, settings))
    versions = registry.list_versions()
    if not versions:
        print(f"no model versions in {registry.root}")
        return 0
    header = f"{'':2}{'version':<8} {'created':<25} {'rows':>6} {'MdAPE':>7} {'MAPE':>7} {'bal.acc':>7} "
    print(header + f"{'band':>6}  reason")
    for info in versions:
        m = info.metadata.get("heldout_metrics", {})
        print(
            f"{'*' if info.in_use else ' ':2}{info.version:<8} {info.metadata.get('created_at', ''):<25} "
            f"{info.metadata.get('data', {}).get('n_rows', 0):>6} {_pct(m.get('throughput_mdape')):>7} "
            f"{_pct(m.get('throughput_mape')):>7} {_num(m.get('failure_balanced_accuracy')):>7} "
            f"{_pct(m.get('band_coverage')):>6}  {info.metadata.get('reason', '')}"
        )
    print("* = in use")
    return 0


def run_models_show(args: argparse.Namespace, settings: Settings) -> int:
    from calibrate.registry import ModelRegistry, RegistryError
    from twin.cli import CommandError

    registry = ModelRegistry(_models_dir(args, settings))
    try:
        version = args.version or registry.in_use()
        if version is None:
            raise CommandError(f"no version is in use in {registry.root}; name one (finetwin models list)")
        metadata = registry.metadata(version)
    except RegistryError as exc:
        raise CommandError(str(exc)) from None
    try:
        registry.verify(version)
        verified = "every artifact matches its manifest"
    except RegistryError as exc:
        verified = f"FAILED: {exc}"
    print(json.dumps({**metadata, "in_use": version == registry.in_use(), "verified": verified}, indent=2))
    return 0


def run_models_promote(args: argparse.Namespace, settings: Settings) -> int:
    from calibrate.promotion import manual_verdict
    from calibrate.registry import ModelRegistry, RegistryError
    from twin.cli import CommandError

    registry = ModelRegistry(_models_dir(args, settings))
    try:
        candidate = registry.metadata(args.version)
        current = registry.in_use()
        if current == args.version:
            print(f"{args.version} is already in use")
            return 0
        in_use = registry.metadata(current) if current else None
        verdict, basis = manual_verdict(candidate, in_use, settings.promote_tolerance)
        if not verdict.not_worse and not args.force:
            reasons = "; ".join(r for r in verdict.reasons if "WORSE" in r or "cannot" in r)
            raise CommandError(
                f"{args.version} is worse than {current} in use ({basis}): {reasons}. "
                "Use --force to promote it anyway."
            )
        reason = "finetwin models promote" + (" --force" if args.force and not verdict.not_worse else "")
        registry.promote(args.version, reason=reason)
    except RegistryError as exc:
        raise CommandError(str(exc)) from None
    print(f"{args.version} is in use (was {current or 'none'}; {basis})")
    return 0


def run_models_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from calibrate.registry import ModelRegistry, RegistryError
    from twin.cli import CommandError

    registry = ModelRegistry(_models_dir(args, settings))
    current = registry.in_use()
    try:
        version = registry.rollback(reason="finetwin models rollback")
    except RegistryError as exc:
        raise CommandError(str(exc)) from None
    print(f"{version} is in use again (was {current})")
    return 0


def _metrics_table(candidate: dict[str, Any], incumbent: dict[str, Any] | None, against: str | None) -> str:
    names = (
        "throughput_mdape",
        "throughput_mape",
        "band_coverage",
        "failure_balanced_accuracy",
        "failure_brier",
    )
    lines = [f"  {'metric':<27} {'new':>8}" + (f" {against or '':>8}" if incumbent else "")]
    for name in names:
        fmt = _num if name.startswith("failure") else _pct
        line = f"  {name:<27} {fmt(candidate.get(name)):>8}"
        if incumbent:
            line += f" {fmt(incumbent.get(name)):>8}"
        lines.append(line)
    return "\n".join(lines)


def _pct(value: Any) -> str:
    return f"{float(value):.1%}" if _finite(value) else "-"


def _num(value: Any) -> str:
    return f"{float(value):.3f}" if _finite(value) else "-"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
