"""The twin's clock is the telemetry's clock.

A cluster's telemetry carries its own time (each event's `ts`). A replay runs that time faster than the wall
clock, a backlog runs it behind, and a cluster whose clock is off runs it beside: whenever the newest event
time and the wall clock disagree by more than a few minutes, the twin believes the telemetry, so a forecast
starts where the cluster is, not where the machine that watches it is. Within the tolerance the wall clock
is the better "now" (a quiet cluster sends nothing for minutes, and time still passes for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, func
from sqlmodel import Session, col, select

from twin.limits import time_window
from twin.settings import TwinSettings
from twin.store import TelemetryEvent

# "A few minutes": a quiet cluster may send nothing for this long without the twin's clock leaving the wall.
DEFAULT_TOLERANCE_S = 300.0
TELEMETRY, WALL = "telemetry", "wall"


def as_utc(ts: datetime) -> datetime:
    """SQLite hands back naive datetimes; the store writes UTC."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class TwinClock:
    """Where the twin stands in time: `now` is a forecast's time 0."""

    now: datetime
    source: str  # TELEMETRY or WALL: which clock `now` was read from
    wall: datetime
    telemetry_latest: datetime | None  # the newest event time of the cluster's telemetry
    telemetry_earliest: datetime | None  # the oldest: history before it is not history, just no telemetry

    @property
    def lag_s(self) -> float | None:
        """Wall minus telemetry time (positive: the telemetry is behind the wall clock)."""
        if self.telemetry_latest is None:
            return None
        return (self.wall - self.telemetry_latest).total_seconds()

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "now": self.now.isoformat(),
            "wall": self.wall.isoformat(),
            "telemetry_latest": self.telemetry_latest.isoformat() if self.telemetry_latest else None,
            "telemetry_lag_s": self.lag_s,
        }


def telemetry_span(
    engine: Engine, cluster_id: str, wall: datetime | None = None
) -> tuple[datetime | None, datetime | None]:
    """The oldest and newest event time of a cluster's telemetry (None, None without any). Only times within
    the window ingest accepts around `wall` (twin.limits) count: a row stored before ingest bounded event
    times (dated year 9999, say) would otherwise set the twin's clock."""
    lowest, highest = time_window(as_utc(wall or datetime.now(UTC)))
    # One query per end: each is then one step down the (cluster, time) index. Together in one SELECT,
    # SQLite read every index entry of the window (3 million events: 0.3 s, on every request that reads
    # the twin's clock, and every scheduler tick).
    window = (
        TelemetryEvent.cluster_id == cluster_id,
        TelemetryEvent.ts >= lowest,  # type: ignore[operator]
        TelemetryEvent.ts <= highest,  # type: ignore[operator]
    )
    with Session(engine) as session:
        earliest, latest = (
            session.exec(select(end(TelemetryEvent.ts)).where(*window)).one() for end in (func.min, func.max)
        )
    return (as_utc(earliest) if earliest else None, as_utc(latest) if latest else None)


def choose_now(
    wall: datetime, telemetry_latest: datetime | None, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> tuple[datetime, str]:
    """The telemetry's newest time when it disagrees with the wall clock by more than `tolerance_s`."""
    wall = as_utc(wall)
    if telemetry_latest is None:
        return wall, WALL
    if abs((wall - telemetry_latest).total_seconds()) > tolerance_s:
        return telemetry_latest, TELEMETRY
    return wall, WALL


def cluster_clock(engine: Engine, settings: TwinSettings, *, wall: datetime | None = None) -> TwinClock:
    """`twin_clock` of the cluster the settings name, with their tolerance."""
    return twin_clock(
        engine, settings.cluster_id, wall=wall, tolerance_s=settings.forecast_clock_tolerance_seconds
    )


def twin_clock(
    engine: Engine,
    cluster_id: str = "default",
    *,
    wall: datetime | None = None,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> TwinClock:
    wall = as_utc(wall or datetime.now(UTC))
    earliest, latest = telemetry_span(engine, cluster_id, wall)
    if latest is not None and (latest - wall).total_seconds() > tolerance_s:
        latest = _corroborated_latest(engine, cluster_id, wall, tolerance_s, latest)
    now, source = choose_now(wall, latest, tolerance_s)
    return TwinClock(now=now, source=source, wall=wall, telemetry_latest=latest, telemetry_earliest=earliest)


# How many events must be dated ahead of the wall clock for the twin to believe the telemetry runs ahead.
CORROBORATING_EVENTS = 3


def _corroborated_latest(
    engine: Engine, cluster_id: str, wall: datetime, tolerance_s: float, latest: datetime
) -> datetime | None:
    """The newest event time, when the telemetry runs ahead of the wall clock: a replay's timeline does, and
    then CORROBORATING_EVENTS events at least are ahead; one event from a clock that runs ahead (ingest
    accepts up to FINETWIN_MAX_CLOCK_SKEW, an hour) is not the cluster's time. It set the twin's clock up to
    an hour ahead, and the intervals in between were scored against a store that had nothing for them yet.
    Then the newest event time not ahead."""
    ahead = wall + timedelta(seconds=tolerance_s)
    lowest, highest = time_window(wall)
    in_cluster = (TelemetryEvent.cluster_id == cluster_id, TelemetryEvent.ts <= highest)  # type: ignore[operator]
    with Session(engine) as session:
        corroborating = session.exec(
            select(TelemetryEvent.ts).where(*in_cluster)
            .order_by(col(TelemetryEvent.ts).desc()).offset(CORROBORATING_EVENTS - 1).limit(1)
        ).first()  # fmt: skip
        if corroborating is not None and as_utc(corroborating) > ahead:
            return latest
        newest = session.exec(
            select(func.max(TelemetryEvent.ts)).where(
                TelemetryEvent.cluster_id == cluster_id,
                TelemetryEvent.ts >= lowest,  # type: ignore[operator]
                TelemetryEvent.ts <= ahead,  # type: ignore[operator]
            )
        ).one()
    return as_utc(newest) if newest is not None else None


def window_start(engine: Engine, cluster_id: str, since: datetime, now: datetime) -> datetime:
    """Where a window of history that asks to start at `since` can start: at `since`, unless the telemetry
    began (or began again) after it, then at its first event. It began again when the newest event before
    `since` is older than the window is long: one stray event dated years back (a node's report from a
    clock that was off) used to count as telemetry all along, and spread the window's jobs over a week they
    were not there for (the arrival rate 80 times too low). A quiet spell shorter than the window (a
    weekend) is history, not a new start."""
    since, now = as_utc(since), as_utc(now)
    in_cluster = TelemetryEvent.cluster_id == cluster_id
    with Session(engine) as session:
        # Each one step along the (cluster, time) index.
        before = session.exec(
            select(func.max(TelemetryEvent.ts)).where(in_cluster, TelemetryEvent.ts < since)  # type: ignore[operator]
        ).one()
        first = session.exec(
            select(func.min(TelemetryEvent.ts)).where(
                in_cluster,
                TelemetryEvent.ts >= since,  # type: ignore[operator]
                TelemetryEvent.ts < now,  # type: ignore[operator]
            )
        ).one()
    if first is None:
        return since
    if before is None or as_utc(first) - as_utc(before) > now - since:
        return as_utc(first)
    return since
