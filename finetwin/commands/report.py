"""`finetwin report`: the characterization report from a benchmark file and/or the observed runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from finetwin import output
from finetwin.commands import add_command
from finetwin.commands.options import BUNDLED, bundled_or_file
from finetwin.errors import CommandError
from finetwin.settings import Settings


def register(app: typer.Typer) -> None:
    add_command(
        app,
        report,
        "report",
        help="characterization report: will jobs run, how fast, will they scale, how to go faster",
        epilog="Writes DIR/report.md, DIR/numbers.json and PNG figures, and points "
        "<data_dir>/reports/latest.json at them.",
    )


def report(
    ctx: typer.Context,
    bench: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            # Typer has no option with an optional value (its is_flag/flag_value do nothing), so the bundled
            # sample is named by a word rather than by --bench alone.
            help=f"an LLMFineTuningBench CSV (38 columns), or {BUNDLED!r} for the bundled real sample "
            "(the default, unless --observed)",
        ),
    ] = None,
    observed: Annotated[
        bool,
        typer.Option("--observed", help="include the runs observed in the store (FINETWIN_DATABASE_URL)"),
    ] = False,
    out: Annotated[
        Path | None, typer.Option(metavar="DIR", help="output directory (default <data_dir>/reports/<time>)")
    ] = None,
    report_format: Annotated[
        Literal["md", "html"],
        typer.Option(
            "--format",
            help="md: report.md, figures, numbers.json; html: also report.html, one self-contained file with "
            "the figures inside, for sharing by mail",
        ),
    ] = "md",
    force: Annotated[
        bool, typer.Option("--force", help="overwrite the files of an earlier report in --out")
    ] = False,
) -> int:
    import pandas as pd

    from calibrate.loader import BenchmarkFormatError, load_benchmark
    from calibrate.report.build import build_report, report_file_names
    from calibrate.report.latest import new_report_dir, record_latest, reports_root
    from twin.output_files import OutputPathError, check_output_dir

    settings: Settings = ctx.obj
    if bench is None and not observed:
        bench = BUNDLED  # as calibrate and replay: the bundled sample unless told otherwise
    if out is not None:
        try:  # before any work: a mistake costs nothing
            check_output_dir(out, report_file_names(), force=force)
        except OutputPathError as exc:
            raise CommandError(f"--out {exc}") from None
    tables: list[pd.DataFrame] = []
    sources: list[str] = []
    if bench is not None:
        path = bundled_or_file(Path(bench))
        try:
            tables.append(load_benchmark(path))
        except BenchmarkFormatError as exc:
            raise CommandError(str(exc)) from None
        sources.append(str(path))
    if observed:
        from calibrate.observed import observed_table
        from finetwin.wiring import migrated_engine

        engine = migrated_engine(settings)
        try:
            runs = observed_table(engine)
        finally:
            engine.dispose()
        store = engine.url.render_as_string(hide_password=True)
        if runs.empty and not tables:
            raise CommandError(
                f"nothing to report on: no observed runs in {store} yet; give --bench FILE, or drop "
                "--observed for the bundled sample"
            )
        tables.append(runs)
        sources.append(f"observed runs in {store}")
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    directory = out or new_report_dir(settings)
    formats = ("md", "html") if report_format == "html" else ("md",)
    try:
        built = build_report(table, directory, source=" + ".join(sources), formats=formats)
        pointer = record_latest(built, reports_root(settings))
    except OSError as exc:  # a place the checks above could not foresee (/proc, a full disk, a race)
        where = exc.filename or directory
        raise CommandError(f"cannot write the report to {where}: {exc.strerror or exc}") from None
    written = [p.name for p in built.figures.values() if p is not None]
    output.say(f"wrote {built.report_md}, {built.numbers_json.name} and {len(written)} figure(s)")
    if built.report_html is not None:
        output.say(f"wrote {built.report_html} (self-contained: figures inside)")
    output.say(f"latest report pointer: {pointer.resolve()}")
    return 0
