"""Small statistics every section of the report shares: how a set of pair ratios is summarized, how a
campaign is named, and how numbers become JSON that says what it means."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

# The benchmark's throughput: dataset tokens / train_runtime for the whole job (train_tokens_per_second
# counts padding and is empty on runs stopped after a time limit).
THROUGHPUT = "dataset_tokens_per_second"
THROUGHPUT_UNIT = "tokens/s"
MEMORY_PEAK = "gpu_memory_utilization_peak"


def ratio_summary(ratios: Iterable[float], *, speedup: bool = False) -> dict[str, Any]:
    """Median, pair count and interquartile range of pair ratios (None when there is no pair).

    For a speedup, the GPU-hours a run saves at the median speedup: a job that runs s× faster holds its
    GPUs 1/s as long, so it saves 1 − 1/s of them.
    """
    values = np.asarray([r for r in ratios if r is not None and math.isfinite(r)], dtype=float)
    summary: dict[str, Any] = {
        "pairs": int(values.size),
        "median": None,
        "q25": None,
        "q75": None,
        "iqr": None,
    }
    if values.size:
        q25, median, q75 = np.percentile(values, [25, 50, 75])
        summary.update(median=float(median), q25=float(q25), q75=float(q75), iqr=float(q75 - q25))
    if speedup:
        median = summary["median"]
        summary["gpu_hours_saved_pct"] = None if median is None else 100.0 * (1.0 - 1.0 / median)
    return summary


def campaign_label(time_limit_s: float | None) -> str:
    """The paper's two campaigns: runs without a time limit and runs capped (e.g. at 600 s)."""
    if time_limit_s is None or (isinstance(time_limit_s, float) and math.isnan(time_limit_s)):
        return "no time limit"
    return f"{time_limit_s:g} s cap"


def campaigns(time_limits: pd.Series) -> pd.Series:
    return time_limits.map(campaign_label)


def pct(part: float, whole: float) -> float | None:
    return None if not whole else 100.0 * part / whole


def key_str(value: Any) -> str:
    """A number as the file writes it without the float quirk (8.0 → "8"), for JSON keys."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)
