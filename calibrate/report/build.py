"""Builds the characterization report: numbers for the four questions, their figures, report.md and
numbers.json in one directory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from calibrate.loader import load_benchmark
from calibrate.report.batch import batch_doubling
from calibrate.report.feasibility import feasibility
from calibrate.report.figures import FIGURE_FILES, draw_all
from calibrate.report.html import HTML_FILE, render_html
from calibrate.report.inventory import inventory
from calibrate.report.optimizations import optimizations
from calibrate.report.render import render
from calibrate.report.scaling import MEMORY_STARVED_PCT, scaling
from calibrate.report.stats import THROUGHPUT, THROUGHPUT_UNIT
from calibrate.report.throughput import throughput
from twin.jsonsafe import json_safe

REPORT_FILE = "report.md"
NUMBERS_FILE = "numbers.json"

DEFINITIONS = {
    "outcome": "valid = is_valid 1; rejected before launch = invalid and breaks an admission rule (checked "
    "in order: GPUs divide the batch, expert-parallel degree divides the GPUs, nodes divide the GPUs); "
    "failed at runtime = every other invalid row",
    "percentages": "share of the experiments in the same row (valid + rejected + runtime = 100)",
    "throughput": f"{THROUGHPUT}: dataset tokens / train_runtime for the whole job, in {THROUGHPUT_UNIT}",
    "matched pair": "valid runs of one configuration at two settings of one factor, all other configuration "
    "columns equal, plus the identifier-only settings and the protocol (experiment_id without the factor's "
    "own token); pair ratio = median throughput of one setting / median throughput of the other",
    "pair statistics": "median over pairs, pair count, interquartile range (q25-q75, linear interpolation)",
    "speedup": "throughput(optimization on) / throughput(off) over matched pairs",
    "GPU-hours saved": "1 - 1/speedup at the median speedup, in % (negative = more GPU-hours)",
    "weak scaling efficiency": "throughput(2g) / (2 x throughput(g)) at equal batch per GPU, both runs on "
    f"the fewest 8-GPU nodes; pairs whose g-GPU run peaks at >= {MEMORY_STARVED_PCT:g} % GPU memory "
    "are left out",
    "strong scaling efficiency": "the same at equal total batch",
    "campaign": "runs without a time limit vs runs capped by stop_after_seconds in their experiment_id",
    "batch doubling": "matched pairs of one-GPU valid runs that differ only in batch size, b and 2b; ratio = "
    "throughput(2b) / throughput(b). Figure 3's medians per batch size mix different models at each batch, "
    "the matched ratio does not",
    "log2 fit": "least squares of Figure 3's median throughput on log2(batch size): slope = tokens/s one "
    "doubling adds, r2 = squared Pearson correlation of log2(batch) and the medians",
    "share faster": "fraction of the matched pairs whose ratio is above 1 (0-1)",
    "rounded shares": "Table 1 prints each row's shares with one decimal, rounded by largest remainder so "
    "the row sums to exactly 100.0",
}


FORMATS = ("md", "html")


@dataclass(frozen=True, slots=True)
class Report:
    """Where a report was written and what it says."""

    out_dir: Path
    report_md: Path
    numbers_json: Path
    figures: dict[str, Path | None]
    numbers: dict[str, Any]
    generated_at: str
    source: str
    report_html: Path | None = None


def compute_numbers(table: pd.DataFrame, *, source: str, generated_at: str | None = None) -> dict[str, Any]:
    """Every number of the report, JSON-ready (NaN → None), from a loader-shaped table."""
    numbers: dict[str, Any] = {
        "meta": {
            "source": source,
            "rows": len(table),
            "generated_at": generated_at or _now(),
            "throughput_column": THROUGHPUT,
            "units": {
                "throughput": THROUGHPUT_UNIT,
                "percentages": "% of experiments",
                "efficiency": "ratio (1 = linear)",
                "speedup": "ratio (x)",
                "gpu_hours_saved_pct": "%",
                "memory": "GB",
                "params": "billions of parameters",
            },
            "definitions": DEFINITIONS,
        },
        "inventory": inventory(table),
        **feasibility(table),
        **throughput(table),
        "batch_doubling": batch_doubling(table),
        **scaling(table),
        **optimizations(table),
    }
    return json_safe(numbers)


def report_file_names() -> list[str]:
    """Every file `build_report` may write or remove in its directory, whatever the formats."""
    return [REPORT_FILE, NUMBERS_FILE, HTML_FILE, *FIGURE_FILES.values()]


def build_report(
    table: pd.DataFrame | str | Path,
    out_dir: str | Path,
    *,
    source: str | None = None,
    formats: tuple[str, ...] = ("md",),
) -> Report:
    """Write report.md, numbers.json and the figures into `out_dir` (created); `table` is a loader-shaped
    table or the path of a benchmark CSV. With "html" in `formats`, also report.html: the same report in one
    self-contained file, figures embedded."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown report format(s) {sorted(unknown)}; known: {', '.join(FORMATS)}")
    if not isinstance(table, pd.DataFrame):
        source = source or str(table)
        table = load_benchmark(table)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    generated_at = _now()
    numbers = compute_numbers(table, source=source or "table", generated_at=generated_at)
    figures = draw_all(numbers, out)
    numbers["figures"] = figures
    _write_atomic(out / NUMBERS_FILE, json.dumps(numbers, indent=2, allow_nan=False) + "\n")
    markdown = render(numbers, figures)
    _write_atomic(out / REPORT_FILE, markdown)
    html_path = None
    if "html" in formats:
        html_path = out / HTML_FILE
        _write_atomic(
            html_path, render_html(markdown, out, title=f"Characterization report: {source or 'table'}")
        )
    elif (out / HTML_FILE).exists():
        # An HTML file left by an earlier report in the same directory would say something this one does not.
        (out / HTML_FILE).unlink()
    return Report(
        out_dir=out.resolve(),
        report_md=(out / REPORT_FILE).resolve(),
        numbers_json=(out / NUMBERS_FILE).resolve(),
        figures={k: (out / v).resolve() if v else None for k, v in figures.items()},
        numbers=numbers,
        generated_at=generated_at,
        source=numbers["meta"]["source"],
        report_html=html_path.resolve() if html_path else None,
    )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_atomic(path: Path, text: str) -> None:
    # A reader (the dashboard) never sees half a file.
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
