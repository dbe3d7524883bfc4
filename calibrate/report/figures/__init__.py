"""The report's figures, drawn from the numbers (never from raw rows) so a figure cannot disagree with
numbers.json. Each has a title, axes with units and its counts; a figure without data is not drawn
(the function returns None and the report says so).

Uses matplotlib's object API on the Agg canvas: no pyplot state, no display needed. Counts sit in a strip
under a line chart or beside a bar, never next to a point where another series' count can land; a median
of few runs and a summary of few pairs are drawn hollow.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from calibrate.report.figures.failures import failures_figure
from calibrate.report.figures.scaling import efficiency_figure, scaling_figure
from calibrate.report.figures.speedups import speedups_figure
from calibrate.report.figures.style import DPI, short_gpu
from calibrate.report.figures.throughput import grid_figure, single_gpu_figure

__all__ = ["DRAWERS", "FIGURE_FILES", "draw_all", "short_gpu"]

FIGURE_FILES = {
    "failures": "fig2_failure_ratios.png",
    "single_gpu": "fig3_throughput_by_batch_single_gpu.png",
    "grid": "fig4_throughput_batch_x_tokens.png",
    "scaling": "fig5_throughput_by_gpu_count.png",
    "efficiency": "fig5b_scaling_efficiency.png",
    "speedups": "fig6_optimization_speedups.png",
}
DRAWERS: dict[str, Callable[[dict[str, Any]], Figure | None]] = {
    "failures": failures_figure,
    "single_gpu": single_gpu_figure,
    "grid": grid_figure,
    "scaling": scaling_figure,
    "efficiency": efficiency_figure,
    "speedups": speedups_figure,
}


def draw_all(numbers: dict[str, Any], out_dir: Path) -> dict[str, str | None]:
    """Every figure that has data, as {name: file name or None}."""
    written: dict[str, str | None] = {}
    for name, draw in DRAWERS.items():
        figure = draw(numbers)
        if figure is None:
            # A figure left by an earlier report in the same directory would show data this one does not have.
            (out_dir / FIGURE_FILES[name]).unlink(missing_ok=True)
            written[name] = None
            continue
        FigureCanvasAgg(figure)
        figure.savefig(out_dir / FIGURE_FILES[name], dpi=DPI)
        written[name] = FIGURE_FILES[name]
    return written
