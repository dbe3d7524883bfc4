"""`finetwin calibrate` (fit a new model version) and `finetwin predict` (a CSV of configurations)."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from calibrate.columns import PREDICT_REQUIRED_COLUMNS, PROTOCOL_DEFAULTS
from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import BUNDLED, ModelsDir, bench_option, models_dir
from finetwin.errors import CommandError
from finetwin.numbers import num, pct
from finetwin.settings import Settings

if TYPE_CHECKING:
    from calibrate.loader import BenchmarkFormatError


def register(app: typer.Typer) -> None:
    add_command(
        app,
        calibrate,
        "calibrate",
        help="fit the throughput and failure models and write a new model version",
        epilog="Fit both models on benchmark CSVs (and the runs observed through telemetry), write a new "
        "version under --models, and put it in use only if its held-out metrics are not worse.",
    )
    add_command(
        app,
        predict,
        "predict",
        help="predict outcome and throughput for a CSV of configurations",
        epilog="Read a CSV of configurations and write the same rows with outcome, rule, p_valid, "
        "tokens_per_second_p10/p50/p90 and note added. Needed columns: "
        f"{', '.join(PREDICT_REQUIRED_COLUMNS)}. Optional (the benchmark's protocol, with their defaults): "
        + ", ".join(f"{c} ({v!r})" for c, v in PROTOCOL_DEFAULTS.items())
        + "; an empty experiment_id means no time limit.",
    )


def calibrate(
    ctx: typer.Context,
    bench: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE",
            callback=bench_option,
            help=f"benchmark CSV (repeatable), or {BUNDLED!r} (the default, unless --observed)",
        ),
    ] = None,
    observed: Annotated[bool, typer.Option("--observed", help="add the runs observed in the store")] = False,
    models: ModelsDir = None,
    seed: Annotated[int, typer.Option(help="seed of the fit and the held-out split")] = 0,
) -> int:
    from calibrate.dataset import WeightPolicy
    from calibrate.loader import BenchmarkFormatError
    from calibrate.refit import calibrate_version
    from finetwin.wiring import migrated_engine

    settings: Settings = ctx.obj
    from calibrate.loader import bundled_benchmark_path

    # Nothing named: the bundled sample, as report and replay do (--observed alone fits observed runs only).
    benchmarks = bench or ([] if observed else [bundled_benchmark_path()])
    if not bench and not observed:
        output.say(
            f"fitting on the bundled benchmark sample ({benchmarks[0].name}; --bench FILE for another)",
            stderr=True,
        )
    engine = migrated_engine(settings) if observed else None
    try:
        result = calibrate_version(
            models_dir(models, settings),
            benchmarks=benchmarks,
            engine=engine,
            observed=observed,
            weights=WeightPolicy(settings.observed_weight, settings.observed_half_life_days),
            tolerance=settings.promote_tolerance,
            reason="finetwin calibrate",
            seed=seed,
        )
    except BenchmarkFormatError as exc:
        raise CommandError(f"bad benchmark: {exc}") from None
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    finally:
        if engine is not None:
            engine.dispose()
    output.say(result.message)
    data = result.metadata.get("data", {})
    output.say("rows: " + ", ".join(f"{k} {v}" for k, v in data.get("rows_by_source", {}).items()))
    left_out = data.get("left_out") or {}
    if left_out:  # said, not done silently: a file given twice, or a run no hardware makes
        output.say("left out: " + ", ".join(f"{why} {count}" for why, count in left_out.items()))
    comparison = result.comparison
    if comparison is not None and comparison.unmeasured:
        # The version is fitted on all its rows; its comparison fit, on the split's training part, on fewer.
        output.say(
            f"not measured on held-out rows: {comparison.unmeasured} on the training part of the split "
            f"({comparison.candidate.get('n_train', 0)} rows; {comparison.test_rows} held out)"
        )
    elif comparison is not None:
        output.say(f"held-out ({comparison.test_rows} rows, basis: {comparison.basis}):")
        output.show(_metrics_table(comparison.candidate, comparison.incumbent, comparison.against))
    return 0


def predict(
    ctx: typer.Context,
    input_csv: Annotated[Path, typer.Option("--input", metavar="CONFIGS.csv")],
    output_csv: Annotated[Path, typer.Option("--output", metavar="PRED.csv")],
    models: ModelsDir = None,
    force: Annotated[bool, typer.Option("--force", help="overwrite --output if it exists")] = False,
) -> int:
    from calibrate import serving
    from calibrate.loader import BenchmarkFormatError
    from calibrate.predict import ConfigsFile, configs_in_chunks, write_predictions
    from calibrate.registry import ModelRegistry, RegistryError
    from twin.output_files import OutputPathError, check_output_file

    settings: Settings = ctx.obj
    try:
        check_output_file(output_csv, force=force)  # before any work: a mistake costs nothing
    except OutputPathError as exc:
        raise CommandError(f"--output {exc}") from None
    # A large file is read a part at a time (`configs_in_chunks`); bad input in the first part (all of any
    # file up to 64 MB) is reported before the models are loaded, in a later part when it is reached.
    parts = configs_in_chunks(input_csv)
    try:
        configs = next(parts)
    except BenchmarkFormatError as exc:
        raise CommandError(_bad_input(exc)) from None
    directory = models_dir(models, settings)
    registry = ModelRegistry(directory)
    # The version as this machine last ran it, if it did (no scikit-learn, no skops); else the registry's.
    loaded = serving.load_in_use(registry)
    from_snapshot = loaded is not None
    loaded = loaded or registry.load_in_use()
    if loaded is None:
        raise CommandError(f"no model version is in use in {directory}; run `finetwin calibrate` first")
    version, job_models = loaded
    if not from_snapshot:
        # Loaded through skops: leave the version's snapshot, so that the next run loads it in a fraction of
        # the time. The trees run through the tree walker (`calibrate.tree_walker`); their own machine code
        # (twice as fast, ~8 s to compile once per version) is compiled by the API's long-lived process.
        with contextlib.suppress(RegistryError):  # changed since it was loaded: the next run loads it again
            serving.save(registry, version, job_models)
    names: Counter[str] = Counter()  # each model's rows, over the file's rows, not its configurations

    def count_models(part: ConfigsFile) -> None:
        names.update(part.table["model_name"].iloc[part.rows].tolist())

    try:
        summary = write_predictions(job_models, itertools.chain([configs], parts), output_csv, count_models)
    except BenchmarkFormatError as exc:  # in a later part of a large file: no output is written
        raise CommandError(_bad_input(exc)) from None
    except OSError as exc:  # a place the checks above could not foresee (/proc, a full disk, a race)
        raise CommandError(f"--output {output_csv}: cannot write there: {exc.strerror or exc}") from None
    _warn_unseen_models(names)  # before the numbers, not as a note after them
    if not summary.rows:
        output.say(
            f"no rows to predict: {input_csv} has a header and no data rows; {output_csv} holds the header"
        )
        return 0
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items()))
    output.say(
        f"{summary.rows} rows predicted with {version} -> {output_csv} ({outcomes}; {summary.flagged} noted)"
    )
    return 0


def _metrics_table(candidate: dict[str, Any], incumbent: dict[str, Any] | None, against: str | None) -> Any:
    names = (
        "throughput_mdape",
        "throughput_mape",
        "band_coverage",
        "failure_balanced_accuracy",
        "failure_brier",
    )
    columns: list[str | tuple[str, str]] = ["metric", ("new", "right")]
    if incumbent:
        columns.append((against or "in use", "right"))
    rows = []
    for name in names:
        fmt = num if name.startswith("failure") else pct
        rows.append([name, fmt(candidate.get(name))] + ([fmt(incumbent.get(name))] if incumbent else []))
    return output.table(columns, rows)


def _bad_input(exc: BenchmarkFormatError) -> str:
    from calibrate.predict import data_row_number

    row = data_row_number(Path(exc.path), exc.line) if exc.line and exc.line > 1 else None
    return f"bad input: {exc}" + (f" (data row {row})" if row else "")


def _warn_unseen_models(counts: Counter[str]) -> None:
    from twin.domain import unseen_model_warning

    for name, rows in sorted(counts.items(), key=lambda item: -item[1]):
        warning = unseen_model_warning(str(name))
        if warning:
            output.say(f"warning ({rows} row{'s' if rows != 1 else ''}): {warning}", stderr=True)
