"""The forecasts' skill over a window from running sums, not from every score.

Each figure's scores are summed per UTC day of their intervals' start (`SkillDay`) in the transaction that
writes them, and each scored forecast keeps the start of its latest scored interval (`ScoredForecast`). The
skill over a window is then the whole days' sums, plus the scores of the one day the window starts inside
of, summed by the database: bounded by a day of scores, not by the length of the record. Every figure of
the skill (MAPE, WAPE, MAE, bias, both coverages) is a ratio of such sums.

The sums are added to with `UPDATE ... SET n = n + :n` (never read and written back), so two writers cannot
lose each other's scores; a day's first row is inserted, and two writers inserting it at once fail one
transaction on the unique key, scores included, which the next scoring writes again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import Engine, case, func, update
from sqlmodel import Session, col, select

from twin.clock import as_utc
from twin.forecast_store import FIGURE_MAX_LENGTH, ForecastScore, ScoredForecast, SkillDay
from twin.retention import kept_from

# The figure name prefix of a declared SLO's forecast: per interval, the share of the runs in which it held,
# scored against whether it held on the record (1 or 0; `twin.skill`).
SLO_PREFIX = "slo/"


def slo_figure(name: str) -> str:
    """The figure an SLO's scores are kept under: SLO_PREFIX and its name; for a name too long for the
    column with the prefix (over 196 characters), its start and a digest of the whole, which keeps two such
    names apart."""
    figure = SLO_PREFIX + name
    if len(figure) <= FIGURE_MAX_LENGTH:
        return figure
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{SLO_PREFIX}{name[: FIGURE_MAX_LENGTH - len(SLO_PREFIX) - len(digest) - 1]}…{digest}"


# Within this, an actual on the band's edge counts as inside (a forecast of 0 jobs and 0 that happened), and
# an actual this close to 0 has no percentage error (floating-point crumbs of an idle GPU type). `twin.skill`
# scores by the same.
EDGE = 1e-9


@dataclass(slots=True)
class Totals:
    """A figure's scores as sums: the columns of `SkillDay`."""

    n: int = 0
    inside: int = 0
    raw_inside: int = 0
    nonzero: int = 0
    sum_error: float = 0.0
    sum_abs_error: float = 0.0
    sum_abs_actual: float = 0.0
    sum_relative_error: float = 0.0
    # Over the intervals scored with a persistence baseline: how many, the twin's absolute error and the
    # baseline's (the same intervals on both sides, so that old scores without one compare nothing).
    persistence_n: int = 0
    sum_abs_error_paired: float = 0.0
    sum_abs_persistence_error: float = 0.0
    # Squared errors, for the Brier score of an SLO's figure (`SLO_PREFIX`: the share of runs in which it
    # held, against 1 or 0). Summed from migration 0013 on: a day before it has 0 here, and no SLO figure.
    sum_squared_error: float = 0.0
    sum_squared_error_paired: float = 0.0
    sum_squared_persistence_error: float = 0.0

    def add(self, other: Totals) -> None:
        for name in _SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def add_score(
        self, mean: float, actual: float, inside: bool, raw_inside: bool, persistence: float | None = None
    ) -> None:
        error = mean - actual
        self.n += 1
        self.inside += int(inside)
        self.raw_inside += int(raw_inside)
        self.sum_error += error
        self.sum_abs_error += abs(error)
        self.sum_abs_actual += abs(actual)
        if abs(actual) > EDGE:
            self.nonzero += 1
            self.sum_relative_error += abs(error) / abs(actual)
        self.sum_squared_error += error * error
        if persistence is not None:
            self.persistence_n += 1
            self.sum_abs_error_paired += abs(error)
            self.sum_abs_persistence_error += abs(persistence - actual)
            self.sum_squared_error_paired += error * error
            self.sum_squared_persistence_error += (persistence - actual) ** 2

    def summary(self) -> dict[str, float | int | None]:
        """The figure's skill, as `twin.skill.skill` reports it."""
        n = self.n
        return {
            "mape": self.sum_relative_error / self.nonzero if self.nonzero else None,
            "wape": self.sum_abs_error / self.sum_abs_actual if self.sum_abs_actual > EDGE else None,
            "mae": self.sum_abs_error / n,
            "bias": self.sum_error / n,
            "coverage": self.inside / n,
            "n": n,
            "raw_coverage": self.raw_inside / n,
            **self.against_persistence(),
        }

    def slo_summary(self) -> dict[str, float | int | None]:
        """An SLO's forecasts as probabilities of its holding: the share of the intervals it was forecast to
        hold in (the mean probability) beside the share it held in, and the Brier score (the mean squared
        difference of probability and outcome: 0 is perfect, 0.25 what always saying 50 % scores), beside
        what always saying the share it held in would have scored (`climatology_brier`: a constant that
        knew the window's outcome share) and against persistence's (it holds, or not, as in the interval
        before the forecast) over the same intervals: `brier_skill` 1 - Brier / persistence's, above 0 the
        twin is better."""
        n, paired = self.n, self.persistence_n
        return {
            "n": n,
            # The mean forecast: the mean of (forecast - actual) + actual, the actuals 1 or 0.
            "forecast_share": (self.sum_error + self.sum_abs_actual) / n,
            "held_share": self.sum_abs_actual / n,
            "brier": self.sum_squared_error / n,
            # Always saying the share it held in over the window (hindsight's constant chance): q (1 - q).
            "climatology_brier": self.sum_abs_actual / n * (1.0 - self.sum_abs_actual / n),
            "persistence_brier": self.sum_squared_persistence_error / paired if paired else None,
            "brier_skill": 1.0 - self.sum_squared_error_paired / self.sum_squared_persistence_error
            if paired and self.sum_squared_persistence_error > EDGE
            else None,
            "persistence_n": paired,
        }

    def against_persistence(self) -> dict[str, float | int | None]:
        """The twin against persistence (the interval before the forecast began, forecast to go on): the
        baseline's MAE and the skill score 1 - MAE(twin) / MAE(persistence) over the same intervals; above 0
        the twin is better, 0.3 is 30 % less error. None where no interval had a baseline, or where
        persistence made no error."""
        paired = self.persistence_n
        has_error = self.sum_abs_persistence_error > EDGE
        return {
            "persistence_mae": self.sum_abs_persistence_error / paired if paired else None,
            "skill_score": 1.0 - self.sum_abs_error_paired / self.sum_abs_persistence_error
            if paired and has_error
            else None,
            "persistence_n": paired,
        }


_SUMS = tuple(f.name for f in fields(Totals))
_KIND = {f.name: int if f.type in ("int", int) else float for f in fields(Totals)}  # counts, or sums


@dataclass(frozen=True, slots=True)
class Scored:
    """One interval score as the sums take it."""

    figure: str
    interval_start: datetime
    mean: float
    actual: float
    inside: bool
    raw_inside: bool
    persistence: float | None = None


def record(session: Session, cluster_id: str, forecast_id: int, scores: Iterable[Scored]) -> None:
    """Adds a forecast's newly written scores to the sums, in the session that writes them."""
    by_day: dict[tuple[str, date], Totals] = {}
    latest: datetime | None = None
    for score in scores:
        start = as_utc(score.interval_start)
        by_day.setdefault((score.figure, start.date()), Totals()).add_score(
            score.mean, score.actual, score.inside, score.raw_inside, score.persistence
        )
        latest = start if latest is None else max(latest, start)
    if latest is None:
        return
    for (figure, day), totals in sorted(by_day.items()):
        added = session.exec(  # type: ignore[call-overload]
            update(SkillDay)
            .where(
                col(SkillDay.cluster_id) == cluster_id,
                col(SkillDay.figure) == figure,
                col(SkillDay.day) == day,
            )
            .values({name: getattr(SkillDay, name) + getattr(totals, name) for name in _SUMS})
        )
        if added.rowcount == 0:
            session.add(SkillDay(cluster_id=cluster_id, figure=figure, day=day, **_values(totals)))
    stored_latest = col(ScoredForecast.latest_interval_start)
    known = session.exec(  # type: ignore[call-overload]
        update(ScoredForecast)
        .where(col(ScoredForecast.cluster_id) == cluster_id, col(ScoredForecast.forecast_id) == forecast_id)
        .values(latest_interval_start=case((stored_latest < latest, latest), else_=stored_latest))
    )
    if known.rowcount == 0:
        session.add(
            ScoredForecast(cluster_id=cluster_id, forecast_id=forecast_id, latest_interval_start=latest)
        )
    session.flush()


def _values(sums: Totals | SkillDay) -> dict[str, Any]:
    """The sums, by name, of a figure's totals or of a stored day."""
    return {name: getattr(sums, name) for name in _SUMS}


def window(engine: Engine, cluster_id: str, since: datetime | None) -> tuple[dict[str, Totals], int]:
    """Per figure, the sums of the scores whose interval starts at or after `since` (all: None), and how many
    forecasts they are of. (`window_start` first, where the scores may have been pruned.)"""
    whole_days_from: date | None = None
    partial: tuple[datetime, datetime] | None = None
    if since is not None:
        since = as_utc(since)
        midnight = datetime.combine(since.date(), time(), tzinfo=UTC)
        if since == midnight:
            whole_days_from = since.date()
        else:  # the rest of the day the window starts in, from the scores themselves
            whole_days_from = since.date() + timedelta(days=1)
            partial = (since, midnight + timedelta(days=1))
    by_figure: dict[str, Totals] = {}
    with Session(engine) as session:
        days = select(SkillDay).where(SkillDay.cluster_id == cluster_id)
        if whole_days_from is not None:
            days = days.where(col(SkillDay.day) >= whole_days_from)
        for row in session.exec(days):
            by_figure.setdefault(row.figure, Totals()).add(Totals(**_values(row)))
        if partial is not None:
            for figure, totals in _summed_scores(session, cluster_id, *partial):
                by_figure.setdefault(figure, Totals()).add(totals)
        forecasts = (
            select(func.count()).select_from(ScoredForecast).where(ScoredForecast.cluster_id == cluster_id)
        )
        if since is not None:
            forecasts = forecasts.where(col(ScoredForecast.latest_interval_start) >= since)
        scored = int(session.exec(forecasts).one())
    return {figure: totals for figure, totals in sorted(by_figure.items()) if totals.n}, scored


def window_start(engine: Engine, cluster_id: str, since: datetime) -> datetime:
    """Where a window asked to start at `since` starts: there, unless the scores of its day were pruned
    (`twin.retention`: the days before the horizon's), then at that day's midnight, whose sums are all that
    is left of it."""
    since = as_utc(since)
    horizon = kept_from(engine, cluster_id)
    if horizon is not None and since.date() < horizon.date():
        return datetime.combine(since.date(), time(), tzinfo=UTC)
    return since


def _summed_scores(
    session: Session, cluster_id: str, start: datetime, end: datetime
) -> Iterable[tuple[str, Totals]]:
    """The sums of the scores whose interval starts in [start, end), per figure, summed by the database."""
    score = ForecastScore
    error = score.forecast_mean - score.actual
    nonzero = func.abs(score.actual) > EDGE
    low = func.coalesce(score.raw_p10, score.forecast_p10) - EDGE
    high = func.coalesce(score.raw_p90, score.forecast_p90) + EDGE
    paired = col(score.persistence).is_not(None)
    query = (
        select(
            score.figure,
            func.count(),
            func.sum(case((col(score.inside), 1), else_=0)),
            func.sum(case(((score.actual >= low) & (score.actual <= high), 1), else_=0)),
            func.sum(case((nonzero, 1), else_=0)),
            func.sum(error),
            func.sum(func.abs(error)),
            func.sum(func.abs(score.actual)),
            func.sum(case((nonzero, func.abs(error) / func.abs(score.actual)), else_=0.0)),
            func.sum(case((paired, 1), else_=0)),
            func.sum(case((paired, func.abs(error)), else_=0.0)),
            func.sum(case((paired, func.abs(score.persistence - score.actual)), else_=0.0)),
            func.sum(error * error),
            func.sum(case((paired, error * error), else_=0.0)),
            func.sum(
                case(
                    (paired, (score.persistence - score.actual) * (score.persistence - score.actual)),
                    else_=0.0,
                )
            ),  # fmt: skip
        )
        .where(
            score.cluster_id == cluster_id,
            col(score.interval_start) >= start,
            col(score.interval_start) < end,
        )
        .group_by(score.figure)
    )
    for figure, *sums in session.exec(query):  # type: ignore[call-overload]
        by_name = dict(zip(_SUMS, sums, strict=True))
        yield figure, Totals(**{name: _KIND[name](value or 0) for name, value in by_name.items()})
