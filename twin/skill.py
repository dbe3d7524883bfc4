"""Every stored forecast scored against what happened.

As the telemetry's time passes the end of an interval of a stored forecast, that interval's figures are
compared with what the store recorded for it (`twin.actuals`): per figure and interval, the error of the
forecast's mean and whether the actual lay inside its p10-p90 band. The skill of the twin over a window is
then, per figure: the mean absolute percentage error (over intervals whose actual is not 0), the weighted
one (total absolute error over total actual: not dominated by nearly idle intervals), the mean absolute
error, the bias, and the coverage (the share of intervals whose actual lay inside the band; an
honest p10-p90 band holds about 0.8 of them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from twin import skill_totals
from twin.actuals import BY_TYPE, OVERALL_FIGURES, JobTimes, load_job_times
from twin.clock import as_utc
from twin.db import session_scope
from twin.forecast_store import (
    STANDING,
    ForecastScore,
    ForecastTimes,
    StoredForecast,
    forecast_times,
    read_forecast,
    stored_forecasts,
)
from twin.skill_totals import SLO_PREFIX, slo_figure
from twin.slo_actual import actual_slo_series, attainment_as_it_happened
from twin.slo_attainment import STORED, SloSet
from twin.store import utcnow
from twin.uncalibrated import FALLBACK_LABEL
from twin.units import parse_duration

_EDGE = skill_totals.EDGE


@dataclass(frozen=True, slots=True)
class IntervalScore:
    figure: str
    index: int
    start_s: float  # seconds from the forecast's start
    end_s: float
    mean: float
    p10: float
    p90: float
    actual: float
    raw_p10: float | None = None  # the ensemble's band where the shown one was recalibrated
    raw_p90: float | None = None
    persistence: float | None = None  # the baseline's forecast: the interval before the forecast, again

    @property
    def raw_inside(self) -> bool:
        low = self.p10 if self.raw_p10 is None else self.raw_p10
        high = self.p90 if self.raw_p90 is None else self.raw_p90
        return low - _EDGE <= self.actual <= high + _EDGE

    @property
    def error(self) -> float:
        return self.mean - self.actual

    @property
    def inside(self) -> bool:
        return self.p10 - _EDGE <= self.actual <= self.p90 + _EDGE


def forecast_bands(document: Mapping[str, Any]) -> dict[str, dict[str, list[float | None]]]:
    """The scored figures of a forecast document's series: name -> {mean, p10, p90} per interval."""
    series = document.get("series") or {}
    bands: dict[str, dict[str, list[float | None]]] = {}
    for name in OVERALL_FIGURES:
        if isinstance(series.get(name), dict):
            bands[name] = series[name]
    for gpu, band in (series.get("utilization_by_type") or {}).items():
        bands[BY_TYPE + gpu] = band
    return bands


def slo_bands(document: Mapping[str, Any]) -> dict[str, dict[str, list[float | None]]]:
    """Per SLO the forecast judged (`SLO_PREFIX` + its name): per interval the share of its runs in which the
    SLO held (mean; a probability) and the runs' p10-p90."""
    attainment = (document.get("series") or {}).get("slo_attainment") or {}
    return {slo_figure(name): band for name, band in attainment.items() if isinstance(band, dict)}


def interval_edges(document: Mapping[str, Any]) -> np.ndarray:
    series = document.get("series") or {}
    starts, ends = series.get("t_s") or [], series.get("interval_end_s") or []
    if not ends:
        return np.zeros(0)
    return np.asarray([starts[0], *ends], dtype=float)


def score_intervals(
    document: Mapping[str, Any],
    actual: Mapping[str, np.ndarray],
    intervals: Iterable[int],
    before: Mapping[str, float] | None = None,
) -> list[IntervalScore]:
    """The forecast's intervals `intervals` against `actual` (figure -> per interval, same intervals as the
    forecast's series). A figure the actuals lack, or an interval whose band has no value, is not scored.
    `before`: per figure, what was recorded over the interval before the forecast's start, which the
    persistence baseline forecasts for every interval."""
    edges = interval_edges(document)
    bands = forecast_bands(document) | slo_bands(document)
    scores: list[IntervalScore] = []
    wanted = list(intervals)
    for name, band in bands.items():
        values = actual.get(name)
        if values is None:
            continue
        raw_low, raw_high = band.get("raw_p10"), band.get("raw_p90")
        for i in wanted:
            mean, p10, p90 = band["mean"][i], band["p10"][i], band["p90"][i]
            if mean is None or p10 is None or p90 is None or not math.isfinite(float(values[i])):
                continue
            raw = (raw_low[i], raw_high[i]) if raw_low is not None and raw_high is not None else (None, None)
            baseline = None if before is None else before.get(name)
            if baseline is not None and not math.isfinite(baseline):
                baseline = None
            scores.append(
                IntervalScore(
                    name, i, float(edges[i]), float(edges[i + 1]), mean, p10, p90, float(values[i]), *raw,
                    persistence=baseline,
                )
            )  # fmt: skip
    return scores


# --- scoring the stored forecasts ---------------------------------------------------------------------------


def _scored_counts(engine: Engine, forecast_ids: Sequence[int]) -> dict[int, int]:
    """How many intervals of each forecast are scored (the next one to score is that index)."""
    if not forecast_ids:
        return {}
    with Session(engine) as session:
        rows = session.exec(
            select(ForecastScore.forecast_id, func.max(ForecastScore.interval_index))
            .where(col(ForecastScore.forecast_id).in_(list(forecast_ids)))
            .group_by(ForecastScore.forecast_id)
        ).all()
    return {int(fid): int(top) + 1 for fid, top in rows}


def score_due(engine: Engine, cluster_id: str, now: datetime, kind: str = STANDING) -> int:
    """Scores every interval of the cluster's stored forecasts that ended by `now` (telemetry time) and is
    not scored yet; returns how many interval scores were written. The jobs are read once for all."""
    now = as_utc(now)
    pending: list[tuple[StoredForecast, list[int]]] = []
    forecasts = stored_forecasts(engine, cluster_id=cluster_id, kind=kind)
    done = _scored_counts(engine, [f.id for f in forecasts if f.id is not None])
    for stored in forecasts:
        assert stored.start is not None and stored.id is not None
        edges = interval_edges(stored.document)
        if len(edges) < 2:
            continue
        ready = _ended(edges, (now - as_utc(stored.start)).total_seconds())
        first = done.get(stored.id, 0)
        if ready > first:
            pending.append((stored, list(range(first, ready))))
    if not pending:
        return 0
    # From the interval before the earliest forecast's start: the persistence baseline's window.
    widest = max(_first_width(interval_edges(s.document)) for s, _ in pending)
    origin = min(as_utc(s.start) for s, _ in pending) - timedelta(seconds=widest)  # type: ignore[arg-type]
    times = load_job_times(engine, cluster_id, origin, now)
    written = 0
    scored_at = utcnow()
    with session_scope(engine) as session:
        for stored, intervals in pending:
            start = as_utc(stored.start)  # type: ignore[arg-type]
            scores = _score_one(stored.document, times, start, intervals)
            skill_totals.record(
                session,
                cluster_id,
                stored.id,  # type: ignore[arg-type]
                (
                    skill_totals.Scored(
                        s.figure,
                        start + timedelta(seconds=s.start_s),
                        s.mean,
                        s.actual,
                        s.inside,
                        s.raw_inside,
                        s.persistence,
                    )
                    for s in scores
                ),
            )
            for s in scores:
                session.add(
                    ForecastScore(
                        forecast_id=stored.id,  # type: ignore[arg-type]
                        cluster_id=cluster_id,
                        figure=s.figure,
                        interval_index=s.index,
                        interval_start=start + timedelta(seconds=s.start_s),
                        interval_end=start + timedelta(seconds=s.end_s),
                        forecast_mean=float(s.mean),
                        forecast_p10=float(s.p10),
                        forecast_p90=float(s.p90),
                        actual=s.actual,
                        inside=s.inside,
                        raw_p10=s.raw_p10,
                        raw_p90=s.raw_p90,
                        persistence=s.persistence,
                        scored_at=scored_at,
                    )
                )
            written += len(scores)
    return written


def _first_width(edges: np.ndarray) -> float:
    return float(edges[1] - edges[0]) if len(edges) > 1 else 0.0


def _ended(edges: np.ndarray, elapsed_s: float) -> int:
    """How many of the intervals `edges` bound have ended `elapsed_s` after the forecast's start."""
    return int(np.searchsorted(edges[1:], elapsed_s, side="right")) if len(edges) > 1 else 0


def _score_one(
    document: Mapping[str, Any], times: JobTimes, start: datetime, intervals: Sequence[int]
) -> list[IntervalScore]:
    """The intervals against what happened, with the persistence baseline: what happened over the interval
    of the first one's width that ended where the forecast started (what the store knew then, or learnt
    of it since: late telemetry helps the baseline, never the twin). Each SLO the forecast judged is scored
    too: whether it held on the record (1 or 0; no score for an interval without data)."""
    offset = (start - times.origin).total_seconds()
    edges = interval_edges(document)[: max(intervals) + 2]
    with_before = np.concatenate(([edges[0] - _first_width(edges)], edges))
    series = actual_slo_series(times, with_before + offset)  # the figures, and what the SLOs bound
    slos = _stored_slos(document)
    if slos is not None:
        for judged in attainment_as_it_happened(slos, series, with_before + offset):
            held = [math.nan if h is None else float(h) for h in judged["held"]]
            series[slo_figure(judged["name"])] = np.asarray(held)
    before = {name: float(values[0]) for name, values in series.items()}
    actual = {name: values[1:] for name, values in series.items()}
    return score_intervals(document, actual, intervals, before)


def _newest_half_passed(forecasts: Sequence[ForecastTimes], now: datetime) -> ForecastTimes:
    """The newest forecast that started at least half its horizon ago, else the oldest."""
    pick = forecasts[0]
    for times in forecasts:
        if (now - as_utc(times.start)).total_seconds() >= float(times.horizon_s or 0.0) / 2:
            pick = times
    return pick


def _passed(stored: StoredForecast, now: datetime) -> int:
    """How many of a stored forecast's intervals have ended by `now`."""
    if stored.start is None:
        return 0
    return _ended(interval_edges(stored.document), (now - as_utc(stored.start)).total_seconds())


class OutsideCalendar(ValueError):
    """A time `since_time` read but cannot take: at the calendar's very ends."""


# The times `since_time` takes: a day inside what datetime can hold, either way.
CALENDAR_START = datetime(1, 1, 2, tzinfo=UTC)
CALENDAR_END = datetime(9999, 12, 30, tzinfo=UTC)


def since_time(text: str, now: datetime) -> datetime | None:
    """Where a window of scored intervals starts (`--since`, `?since=`): a duration back from `now` (24h,
    7d) or an RFC 3339 time (UTC where it names no zone). None for a duration reaching back further than the
    calendar does: every interval (it raised OverflowError, a traceback or a 500). Raises ValueError saying
    what it takes."""
    try:
        seconds = parse_duration(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        try:
            return now - timedelta(seconds=seconds)
        except OverflowError:
            return None
    written = text.strip()
    try:
        parsed = datetime.fromisoformat(written[:-1] + "+00:00" if written[-1:] in "Zz" else written)
    except ValueError:
        raise ValueError(f"not a time or a duration: {text!r} (e.g. 24h or 2025-01-01T00:00:00Z)") from None
    try:
        when = as_utc(parsed)
    except OverflowError:  # 0001-01-01T00:00+01:00 is in the year 0 in UTC
        when = None
    # A day inside the calendar's ends: a window's arithmetic (the day after `since`) stays inside it.
    if when is None or not CALENDAR_START <= when <= CALENDAR_END:
        raise OutsideCalendar(
            f"{text!r} is at the calendar's end: give a time between {CALENDAR_START.date()} and "
            f"{CALENDAR_END.date()} (UTC)"
        )
    return when


def skill(engine: Engine, cluster_id: str, since: datetime | None = None) -> dict[str, Any]:
    """The twin's skill over the scored intervals that start at or after `since` (telemetry time): how many
    forecasts and interval figures were scored, and per figure {mape, wape, mae, bias, coverage, n}, with
    `raw_coverage`: how often the ensemble's own band (before `twin.band_calibration`) held the actual;
    per SLO the forecasts judged, their probabilities of its holding against whether it held
    (`skill_totals.Totals.slo_summary`; not counted in `intervals`). From the scores' running sums
    (`twin.skill_totals`): the numbers of every score summarized, in a time that does not grow with the
    record. A window that starts on a day whose scores were pruned starts at its midnight (`since` says so).
    """
    if since is not None:
        since = skill_totals.window_start(engine, cluster_id, since)
    by_figure, scored = skill_totals.window(engine, cluster_id, since)
    figures = {name: totals for name, totals in by_figure.items() if not name.startswith(SLO_PREFIX)}
    return {
        "since": as_utc(since).isoformat() if since is not None else None,
        "scored": scored,
        "intervals": sum(totals.n for totals in figures.values()),
        "figures": {figure: totals.summary() for figure, totals in figures.items()},
        "slos": {
            name.removeprefix(SLO_PREFIX): totals.slo_summary()
            for name, totals in by_figure.items()
            if name.startswith(SLO_PREFIX)
        },
    }


def forecast_vs_actual(
    engine: Engine, cluster_id: str, now: datetime, kind: str = STANDING
) -> dict[str, Any] | None:
    """A stored forecast with what happened drawn over it: the newest one that started at least half its
    horizon ago (so half its band has actuals), else the oldest kept; of those made by calibrated models
    once one of them has an interval that has passed (a fresh installation's first forecast, the
    fallback's, would otherwise stand for the twin for half a horizon). Per figure: the band per interval
    and the actual for the intervals that have passed; the forecast's age on the telemetry's clock."""
    now = as_utc(now)
    every = forecast_times(engine, cluster_id=cluster_id, kind=kind)
    if not every:
        return None
    calibrated = [times for times in every if times.models != FALLBACK_LABEL]
    pick = _newest_half_passed(calibrated or every, now)
    chosen = read_forecast(engine, pick.id)
    if chosen is not None and not _passed(chosen, now) and calibrated and len(calibrated) < len(every):
        # Nothing of the calibrated models' forecast has happened yet: the one that has, until it has.
        chosen = read_forecast(engine, _newest_half_passed(every, now).id)
    if chosen is None:  # pruned since: the next poll picks another
        return None
    start = as_utc(chosen.start)  # type: ignore[arg-type]
    edges = interval_edges(chosen.document)
    elapsed = (now - start).total_seconds()
    ready = _ended(edges, elapsed)
    actual: dict[str, np.ndarray] = {}
    if ready:
        actual = actual_slo_series(load_job_times(engine, cluster_id, start, now), edges[: ready + 1])
    figures = {}
    for name, band in forecast_bands(chosen.document).items():
        values = actual.get(name)
        figures[name] = {
            "mean": band["mean"],
            "p10": band["p10"],
            "p90": band["p90"],
            "actual": [  # null for an interval to come, or one without data (no GPU up)
                float(values[i]) if values is not None and i < ready and math.isfinite(values[i]) else None
                for i in range(len(band["mean"]))
            ],
        }
    created = as_utc(chosen.created_at)
    return {
        "forecast_id": chosen.id,
        "start": start.isoformat(),
        "created_at": created.isoformat(),
        "age_s": elapsed,  # on the twin's clock: how much telemetry time has passed since it was made
        # Which models made it: a fresh installation's first forecasts are the uncalibrated fallback's
        # ("fallback": no runtime failures), and drawn against what happened they are not the twin's skill.
        "models": chosen.document.get("models"),
        "t_s": edges[:-1].tolist(),
        "interval_end_s": edges[1:].tolist(),
        "intervals_passed": ready,
        "figures": figures,
        "slos": slos_vs_actual(chosen.document, actual if ready else None, edges[: ready + 1]),
    }


def slos_vs_actual(
    document: Mapping[str, Any], passed: dict[str, np.ndarray] | None, passed_edges: np.ndarray
) -> list[dict[str, Any]]:
    """Per SLO the forecast judged: the attainment it forecast over its horizon (mean, p10-p90 across runs)
    and the attainment so far, on what the store recorded over the intervals that have passed (`passed`:
    `twin.slo_actual.actual_slo_series` over `passed_edges`, None before one has), by the same definitions
    (null before one with data)."""
    forecast = _judged_slos(document)
    actual: list[dict[str, Any]] = [{} for _ in forecast]
    slos = _stored_slos(document)
    if slos is not None and passed is not None and len(passed_edges) > 1:
        actual = attainment_as_it_happened(slos, passed, passed_edges)
    return [
        {
            "name": said["name"],
            "forecast": said.get("attainment"),
            "actual": happened.get("attainment"),
            "judged": happened.get("judged", 0),
        }
        for said, happened in zip(forecast, actual, strict=True)
    ]


def _judged_slos(document: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in document.get("slos") or [] if isinstance(s, Mapping) and s.get("metric")]


def _stored_slos(document: Mapping[str, Any]) -> SloSet | None:
    """The SLOs the forecast judged, as it stored them (checked when they were declared; a document is not
    refused again); None for a document of another version's SLOs: its forecast is said, nothing measured
    beside it."""
    written = [
        {k: s.get(k) for k in ("name", "metric", "max", "min", "gpu_model")} for s in _judged_slos(document)
    ]
    try:
        return SloSet.model_validate({"slos": written}, context={STORED: True})
    except ValueError:
        return None
