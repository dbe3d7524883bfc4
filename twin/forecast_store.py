"""Stored forecasts: the standing forecast the API refreshes on a schedule, and forecasts made on demand;
and their scores against what then happened (`twin.skill`).

The forecast itself is one JSON document (what `twin.forecast.forecast` returns); a few columns beside it
say which cluster, when (on the wall clock and on the telemetry's: `start`), and how it was made, so the
latest one is one indexed query away. A score is one figure of one interval of one forecast; scores outlive
the forecasts they score (only the newest forecasts are kept, the record of how good they were stays), and
are summed per figure and day as they are written, for the skill over long windows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Engine,
    Float,
    Index,
    UniqueConstraint,
)
from sqlmodel import Field, Session, SQLModel, col, select

from twin.db import session_scope
from twin.store import utcnow

STANDING = "standing"
ON_DEMAND = "on_demand"


FIGURE_MAX_LENGTH = 200  # a score's figure name (`forecast_scores.figure`, `forecast_skill_days.figure`)


class StoredForecast(SQLModel, table=True):
    __tablename__ = "forecasts"
    __table_args__ = (Index("ix_forecasts_cluster_kind_created", "cluster_id", "kind", "created_at"),)

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(max_length=200)
    kind: str = Field(max_length=16)  # standing | on_demand
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    # Time 0 of the forecast on the twin's clock (the telemetry's time for live forecasts).
    start: datetime | None = Field(default=None, sa_column=Column(DateTime(timezone=True), nullable=True))
    horizon_s: float | None = None
    runs: int
    seed: int = Field(sa_column=Column(BigInteger, nullable=False))
    wall_s: float | None = None
    # The document's `models` ("calibrated v0003", "fallback"; NULL: stored before 0011), to choose among
    # forecasts without reading their documents.
    models: str | None = Field(default=None, max_length=200)
    document: dict = Field(sa_column=Column(JSON, nullable=False))


def save_forecast(
    engine: Engine, document: dict[str, Any], *, cluster_id: str, kind: str = STANDING, keep: int = 100
) -> int:
    """Stores a forecast and keeps only the newest `keep` of its cluster and kind; returns its id."""
    with session_scope(engine) as session:
        row = StoredForecast(
            cluster_id=cluster_id,
            kind=kind,
            created_at=utcnow(),
            start=_parse_time(document.get("start")),
            horizon_s=document.get("horizon_s"),
            runs=int(document.get("runs", 0)),
            seed=int(document.get("seed", 0)),
            wall_s=document.get("wall_s"),
            models=_label(document.get("models")),
            document=document,
        )
        session.add(row)
        session.flush()
        new_id = int(row.id)  # type: ignore[arg-type]
        old = session.exec(
            select(StoredForecast.id)
            .where(StoredForecast.cluster_id == cluster_id, StoredForecast.kind == kind)
            .order_by(col(StoredForecast.created_at).desc(), col(StoredForecast.id).desc())
            .offset(keep)
        ).all()
        for stale in old:
            session.delete(session.get(StoredForecast, stale))
    return new_id


def latest_forecast(engine: Engine, *, cluster_id: str, kind: str = STANDING) -> StoredForecast | None:
    with Session(engine, expire_on_commit=False) as session:
        return session.exec(
            select(StoredForecast)
            .where(StoredForecast.cluster_id == cluster_id, StoredForecast.kind == kind)
            .order_by(col(StoredForecast.created_at).desc(), col(StoredForecast.id).desc())
            .limit(1)
        ).first()


class ForecastScore(SQLModel, table=True):
    """One figure of one interval of a stored forecast, against what the store recorded for it."""

    __tablename__ = "forecast_scores"
    __table_args__ = (
        UniqueConstraint("forecast_id", "figure", "interval_index", name="uq_forecast_scores_interval"),
        Index("ix_forecast_scores_cluster_start", "cluster_id", "interval_start"),
    )

    id: int | None = Field(default=None, primary_key=True)
    forecast_id: int  # no foreign key: the score stays when old forecasts are pruned
    cluster_id: str = Field(max_length=200)
    # e.g. utilization, queue_length, utilization/NVIDIA-A100-SXM4-80GB, slo/<name> (twin.skill_totals)
    figure: str = Field(max_length=FIGURE_MAX_LENGTH)
    interval_index: int
    interval_start: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    interval_end: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    forecast_mean: float
    forecast_p10: float
    forecast_p90: float
    actual: float
    inside: bool = Field(sa_column=Column(Boolean, nullable=False))  # p10 <= actual <= p90
    # The ensemble's own band, where the shown one was recalibrated (twin.band_calibration); else NULL.
    raw_p10: float | None = None
    raw_p90: float | None = None
    # What persistence forecast: the interval before the forecast began, again (NULL: scored before 0011).
    persistence: float | None = None
    scored_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value)


def stored_forecasts(
    engine: Engine, *, cluster_id: str, kind: str = STANDING, started_after: datetime | None = None
) -> list[StoredForecast]:
    """A cluster's stored forecasts of a kind that have a start, oldest first."""
    with Session(engine, expire_on_commit=False) as session:
        query = select(StoredForecast).where(
            StoredForecast.cluster_id == cluster_id,
            StoredForecast.kind == kind,
            col(StoredForecast.start).is_not(None),
        )
        if started_after is not None:
            query = query.where(col(StoredForecast.start) > started_after)
        return list(session.exec(query.order_by(col(StoredForecast.start), col(StoredForecast.id))).all())


@dataclass(frozen=True, slots=True)
class ForecastTimes:
    id: int
    start: datetime
    horizon_s: float | None
    models: str | None = None  # the forecast's models: "calibrated v0003", "fallback"


def _label(models: object) -> str | None:
    return models[:200] if isinstance(models, str) else None


def forecast_times(engine: Engine, *, cluster_id: str, kind: str = STANDING) -> list[ForecastTimes]:
    """When each of a cluster's stored forecasts of a kind starts and how far it looks, oldest first: which
    one to read, without reading every document (100 of them took 40-80 ms a dashboard poll)."""
    with Session(engine) as session:
        rows = session.exec(
            select(StoredForecast.id, StoredForecast.start, StoredForecast.horizon_s, StoredForecast.models)
            .where(
                StoredForecast.cluster_id == cluster_id,
                StoredForecast.kind == kind,
                col(StoredForecast.start).is_not(None),
            )
            .order_by(col(StoredForecast.start), col(StoredForecast.id))
        ).all()
    return [ForecastTimes(int(i), start, horizon, label) for i, start, horizon, label in rows]  # type: ignore[arg-type]


def read_forecast(engine: Engine, forecast_id: int) -> StoredForecast | None:
    """One stored forecast with its document; None once it has been pruned."""
    with Session(engine, expire_on_commit=False) as session:
        return session.get(StoredForecast, forecast_id)


class SkillDay(SQLModel, table=True):
    """The scores of one figure whose intervals start on one UTC day, as running sums (`twin.skill_totals`):
    the skill over any window is a few of these and at most one day of scores, however long the record
    (over every score, a month of the standing forecast took 5.5-10 s a request, and as long a Prometheus
    scrape)."""

    __tablename__ = "forecast_skill_days"
    __table_args__ = (UniqueConstraint("cluster_id", "figure", "day", name="uq_forecast_skill_days"),)

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(max_length=200)
    figure: str = Field(max_length=FIGURE_MAX_LENGTH)
    day: date = Field(sa_column=Column(Date, nullable=False))  # of the intervals' start, UTC
    n: int = Field(sa_column=Column(BigInteger, nullable=False))
    inside: int = Field(sa_column=Column(BigInteger, nullable=False))
    raw_inside: int = Field(sa_column=Column(BigInteger, nullable=False))
    nonzero: int = Field(sa_column=Column(BigInteger, nullable=False))  # intervals whose actual is not 0
    sum_error: float
    sum_abs_error: float
    sum_abs_actual: float
    sum_relative_error: float  # over the intervals whose actual is not 0
    # The persistence baseline against the twin, over the intervals scored with a baseline (twin.skill).
    persistence_n: int = Field(default=0, sa_column=Column(BigInteger, nullable=False, server_default="0"))
    sum_abs_error_paired: float = Field(
        default=0.0, sa_column=Column(Float, nullable=False, server_default="0")
    )
    sum_abs_persistence_error: float = Field(
        default=0.0, sa_column=Column(Float, nullable=False, server_default="0")
    )
    # Squared errors (migration 0013), for the SLOs' Brier scores (twin.skill_totals).
    sum_squared_error: float = Field(default=0.0, sa_column=Column(Float, nullable=False, server_default="0"))
    sum_squared_error_paired: float = Field(
        default=0.0, sa_column=Column(Float, nullable=False, server_default="0")
    )
    sum_squared_persistence_error: float = Field(
        default=0.0, sa_column=Column(Float, nullable=False, server_default="0")
    )


class ScoredForecast(SQLModel, table=True):
    """Each scored forecast and the start of its latest scored interval: how many forecasts a window's skill
    is over, without reading their scores."""

    __tablename__ = "forecast_skill_forecasts"
    __table_args__ = (
        UniqueConstraint("cluster_id", "forecast_id", name="uq_forecast_skill_forecasts"),
        Index("ix_forecast_skill_forecasts_cluster_latest", "cluster_id", "latest_interval_start"),
    )

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(max_length=200)
    forecast_id: int
    latest_interval_start: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
