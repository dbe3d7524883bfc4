"""Small statistics every section of the report shares: how a set of pair ratios is summarized, how a
campaign is named, and how numbers become JSON that says what it means."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
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


def largest_remainder_pct(counts: Sequence[int], decimals: int = 1) -> list[float] | None:
    """Shares of `counts` in %, rounded to `decimals` so they add up to exactly 100 (largest remainder).

    Rounding each share on its own can make a row sum to 99.9 or 100.1; instead every share is cut down to
    its `decimals`, and the units still missing go one each to the shares that lost the most (ties: the
    earlier share first), as the paper's Table 1 does. None when the counts are all zero."""
    total = sum(counts)
    if total <= 0:
        return None
    unit = 10**decimals
    # Integer arithmetic: the cut and what it leaves over are exact, so equal remainders tie exactly.
    floors = [100 * unit * c // total for c in counts]
    left_over = [100 * unit * c % total for c in counts]
    missing = 100 * unit - sum(floors)
    by_remainder = sorted(range(len(counts)), key=lambda i: -left_over[i])
    for i in by_remainder[:missing]:
        floors[i] += 1
    return [f / unit for f in floors]


def key_str(value: Any) -> str:
    """A number as the file writes it without the float quirk (8.0 → "8"), for JSON keys."""
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    return str(value)
