"""Numbers as the commands print them ("-" for a missing or non-finite value)."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def pct(value: Any) -> str:
    return f"{float(value):.1%}" if finite(value) else "-"


def num(value: Any) -> str:
    return f"{float(value):.3f}" if finite(value) else "-"


def short(value: Any) -> str:
    """Three significant digits, thousands separated above 1000."""
    if not finite(value):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def duration(seconds: Any) -> str:
    """Seconds as people read them: 45 s, 12.5 min, 6.4 h, 3.2 d."""
    if not finite(seconds):
        return "-"
    size = abs(seconds)
    if size < 60:
        return f"{seconds:.3g} s"
    if size < 3600:
        return f"{seconds / 60:.3g} min"
    if size < 4 * 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


# Figures that are shares of something (printed as %); the others by their name's unit.
FRACTION_FIGURES = frozenset({"utilization", "runtime_failure_ratio", "attainment", "probability_met"})


def human(figure: str, value: Any) -> str:
    """A twin figure in the unit its name says: `*_s` as a duration, shares as %, kWh, GPU-hours; full
    precision stays in --json."""
    if not finite(value):
        return "-"
    if figure.endswith("_s"):
        return duration(value)
    if figure in FRACTION_FIGURES or figure.startswith("utilization"):
        return f"{100 * value:.1f} %"
    if figure.endswith("_kwh"):
        return f"{short(value)} kWh"
    if figure.endswith("gpu_hours"):
        return f"{short(value)} GPU-h"
    return short(value)


def label(figure: str) -> str:
    """A figure's name as a table row says it, its unit left to the cells `human` writes: `wait_mean_s`
    (whose cells read "1.2 h") is "wait mean", `energy_kwh` "energy", `failed_gpu_hours` "failed
    GPU-hours"."""
    for unit in ("_s", "_kwh"):
        figure = figure.removesuffix(unit)
    return figure.replace("gpu_hours", "GPU-hours").replace("_", " ")


def signed(figure: str, value: Any) -> str:
    """A difference in the figure's unit, with its sign (+12.0 %, -3.5 min)."""
    if not finite(value):
        return "-"
    text = human(figure, value)
    return text if text.startswith("-") else f"+{text}"
