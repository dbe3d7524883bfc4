"""Bands recalibrated on the twin's own record: online split conformal prediction.

The ensemble's p10-p90 band carries what the twin knows is uncertain (the models' errors, shared within
families; arrivals; failure times). What it does not know it cannot spread: how its simplifications of the
cluster (placement, scheduling latency, the arrival process's own variability) differ from the real one.
Every stored forecast is scored against what happened (`twin.skill`), so the twin knows how its bands
did; this module turns that record into a margin per figure (conformalized quantile regression, Romano et
al. 2019): each scored interval's conformity score is how far the actual lay outside the ensemble's band
(negative inside), e = max(p10 - actual, actual - p90), and a new forecast's band becomes
[p10 - q, p90 + q], with q the ceil((n + 1) * 0.8)-th smallest of the n scores of that figure. If the past
holds for the future, about 80 % of actuals then lie inside the band, whatever the ensemble missed; q is
negative (a narrower band) where the ensemble was too wide.

Only intervals that ended before the new forecast starts are used (nothing it could not have known), from a
trailing window of telemetry time, and only once a figure has MIN_SCORES of them. The ensemble's own band is
kept beside the calibrated one (`raw_p10`, `raw_p90`), scored too, so the margin is always measured on the
ensemble's bands (never on bands it widened itself) and the skill reports both coverages.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from twin.actuals import BY_TYPE
from twin.clock import as_utc
from twin.forecast_store import ForecastScore
from twin.skill import forecast_bands
from twin.skill_totals import SLO_PREFIX

# The band is p10-p90: it should hold 80 % of what happens.
CONFORMAL_LEVEL = 0.8
# Fewer scored intervals than this say too little about a figure's misses: its band stays the ensemble's.
MIN_SCORES = 20
DEFAULT_WINDOW = timedelta(days=7)
# The newest scores a margin is taken from: a standing forecast every 5 min for 7 days is ~50 scores per
# figure and hour of horizon; this bounds each forecast's read of the record (~10 figures x 5,000) whatever
# the cadence, and 5,000 recent intervals per figure say all a quantile at 0.8 can.
MAX_SCORES = 50_000


@dataclass(frozen=True, slots=True)
class Margin:
    value: float  # added below p10 and above p90 (negative: the band narrows)
    scores: int  # how many scored intervals it comes from


def conformity(p10: float, p90: float, actual: float) -> float:
    """How far `actual` lay outside [p10, p90]; negative inside (minus the distance to the nearer edge)."""
    return max(p10 - actual, actual - p90)


def margins_from_scores(
    rows: Iterable[tuple[str, float, float, float]],
    level: float = CONFORMAL_LEVEL,
    min_scores: int = MIN_SCORES,
) -> dict[str, Margin]:
    """Per figure, from (figure, ensemble p10, ensemble p90, actual) rows: the split-conformal margin."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"the conformal level must be in (0, 1), got {level}")
    by_figure: dict[str, list[float]] = {}
    for figure, p10, p90, actual in rows:
        by_figure.setdefault(figure, []).append(conformity(p10, p90, actual))
    margins: dict[str, Margin] = {}
    for figure, scores in sorted(by_figure.items()):
        n = len(scores)
        if n < min_scores:
            continue
        k = min(n, math.ceil((n + 1) * level)) - 1  # the finite-sample quantile of split conformal
        margins[figure] = Margin(float(np.sort(np.asarray(scores, dtype=float))[k]), n)
    return margins


def load_margins(
    engine: Engine,
    cluster_id: str,
    before: datetime,
    window: timedelta = DEFAULT_WINDOW,
    level: float = CONFORMAL_LEVEL,
    min_scores: int = MIN_SCORES,
) -> dict[str, Margin]:
    """The margins from the cluster's intervals that ended in (before - window, before]."""
    before = as_utc(before)
    with Session(engine) as session:
        rows = session.exec(
            select(
                ForecastScore.figure,
                func.coalesce(ForecastScore.raw_p10, ForecastScore.forecast_p10),
                func.coalesce(ForecastScore.raw_p90, ForecastScore.forecast_p90),
                ForecastScore.actual,
            )
            .where(
                ForecastScore.cluster_id == cluster_id,
                col(ForecastScore.interval_end) <= before,
                col(ForecastScore.interval_end) > before - window,
                # An SLO's scores are chances against 1 or 0, not a band of a figure: none of the budget.
                ~col(ForecastScore.figure).startswith(SLO_PREFIX),
            )
            .order_by(col(ForecastScore.interval_start).desc())  # the newest first, on the start index
            .limit(MAX_SCORES)
        ).all()
    return margins_from_scores(((str(f), float(lo), float(hi), float(a)) for f, lo, hi, a in rows), level,
                               min_scores)  # fmt: skip


def _ceiling(figure: str) -> float:
    """The largest value a figure can take: utilization is a share, the others are counts or energy."""
    return 1.0 if figure == "utilization" or figure.startswith(BY_TYPE) else math.inf


def calibrate_bands(
    document: dict[str, Any], margins: Mapping[str, Margin], *, window: timedelta = DEFAULT_WINDOW
) -> dict[str, Any]:
    """The forecast document with each scored series' band moved out (or in) by its figure's margin, never
    past the mean, below 0 or above a share's 1; the ensemble's band kept as raw_p10/raw_p90. Says what it
    did in `band_calibration`."""
    applied: dict[str, dict[str, float | int]] = {}
    for figure, band in forecast_bands(document).items():
        raw_low, raw_high = list(band["p10"]), list(band["p90"])
        band["raw_p10"], band["raw_p90"] = raw_low, raw_high
        margin = margins.get(figure)
        if margin is None:
            continue
        top = _ceiling(figure)
        low, high = [], []
        for mean, p10, p90 in zip(band["mean"], raw_low, raw_high, strict=True):
            if mean is None or p10 is None or p90 is None:
                low.append(p10)
                high.append(p90)
                continue
            low.append(max(min(p10 - margin.value, mean), 0.0))
            high.append(min(max(p90 + margin.value, mean), top))
        band["p10"], band["p90"] = low, high
        applied[figure] = {"margin": margin.value, "scores": margin.scores}
    document["band_calibration"] = {
        "method": "split conformal on the twin's scored forecasts",
        "level": CONFORMAL_LEVEL,
        "window_s": window.total_seconds(),
        "figures": applied,
    }
    return document


def calibrated_forecast(
    engine: Engine, cluster_id: str, document: dict[str, Any], window: timedelta = DEFAULT_WINDOW
) -> dict[str, Any]:
    """`calibrate_bands` with the margins of the intervals scored before the forecast's start."""
    start = document.get("start")
    if not start:
        return document
    margins = load_margins(engine, cluster_id, datetime.fromisoformat(str(start)), window)
    return calibrate_bands(document, margins, window=window)
