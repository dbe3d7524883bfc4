"""`finetwin report`: the characterization report from a benchmark file and/or the observed runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from twin.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    report = subparsers.add_parser(
        "report",
        help="characterization report: will jobs run, how fast, will they scale, how to go faster",
        description="Writes DIR/report.md, DIR/numbers.json and PNG figures, and points "
        "<data_dir>/reports/latest.json at them.",
    )
    report.add_argument(
        "--bench",
        type=Path,
        nargs="?",
        const="bundled",
        metavar="FILE",
        help="an LLMFineTuningBench CSV (38 columns); without FILE, the bundled real sample",
    )
    report.add_argument(
        "--observed",
        action="store_true",
        help="include the runs observed in the store (FINETWIN_DATABASE_URL)",
    )
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output directory (default <data_dir>/reports/<time>)",
    )
    report.add_argument(
        "--format",
        choices=("md", "html"),
        default="md",
        help="md: report.md, figures, numbers.json; html: also report.html, one self-contained file with the "
        "figures inside, for sharing by mail",
    )
    report.set_defaults(handler=run_report)


def run_report(args: argparse.Namespace, settings: Settings) -> int:
    import pandas as pd

    from calibrate.loader import BenchmarkFormatError, bundled_benchmark_path, load_benchmark
    from calibrate.report.build import build_report
    from calibrate.report.latest import record_latest, reports_root
    from twin.cli import CommandError

    if args.bench is None and not args.observed:
        raise CommandError("nothing to report on: give --bench FILE and/or --observed")
    tables: list[pd.DataFrame] = []
    sources: list[str] = []
    if args.bench is not None:
        path = bundled_benchmark_path() if str(args.bench) == "bundled" else args.bench
        try:
            tables.append(load_benchmark(path))
        except BenchmarkFormatError as exc:
            raise CommandError(str(exc)) from None
        sources.append(str(path))
    if args.observed:
        from calibrate.observed import observed_table
        from twin.db import engine_from_settings, migrate

        engine = engine_from_settings(settings)
        try:
            migrate(engine)
            tables.append(observed_table(engine))
        finally:
            engine.dispose()
        sources.append(f"observed runs in {engine.url.render_as_string(hide_password=True)}")
    table = pd.concat(tables, ignore_index=True) if len(tables) > 1 else tables[0]
    out = args.out or reports_root(settings) / pd.Timestamp.now(tz="UTC").strftime("%Y%m%dT%H%M%SZ")
    formats = ("md", "html") if args.format == "html" else ("md",)
    report = build_report(table, out, source=" + ".join(sources), formats=formats)
    pointer = record_latest(report, reports_root(settings))
    written = [p.name for p in report.figures.values() if p is not None]
    print(f"wrote {report.report_md}, {report.numbers_json.name} and {len(written)} figure(s)")
    if report.report_html is not None:
        print(f"wrote {report.report_html} (self-contained: figures inside)")
    print(f"latest report pointer: {pointer.resolve()}")
    return 0
