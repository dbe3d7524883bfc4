"""Keeps the store's record bounded: what is older than `FINETWIN_KEEP_TELEMETRY_DAYS` of telemetry time is
pruned.

A store that runs for months grows by its raw events (a job's submission, start, progress reports and end;
a node's heartbeat every minute, 1,440 events a day each) and by the standing forecast's scores (~69,000 a
day at the default cadence). Neither is read beyond a forecast's lookback once it has been folded into the
rows that last: the jobs (one row each, what counts, the live error and the observed runs the models learn
from read), each node's row and its changes, the skill's daily sums.

Dated before the horizon, `prune` deletes
- the events of the jobs that ended before it, and the nodes' raw reports;
- the nodes' changes (`node_status_changes`), but each node's latest: the state its history starts from;
- the forecasts' scores of the UTC days before the horizon's day (the days' sums stay, so the skill over the
  whole record is what it was).
It keeps, whatever their age: the events of a job still open at the horizon (a backtest rebuilds the job
from them), the jobs' rows, the observed runs, the live errors, the audit log, the model versions.

The horizon is telemetry time, as the twin's clock reads it (`twin.clock`): a replay dated in 2025 is pruned
by its own timeline, and a cluster that stopped reporting keeps its last weeks. It only moves forward, and
is recorded (`twin.store.TelemetryRetention`): ingest dead-letters what would land before it (an event of a
job that ended before it, a node's report: the events it would be checked against are gone, so a
redelivery would be applied again), and a backtest whose window starts before it is refused.

Rows are deleted a chunk at a time, each in its own transaction, so that ingest (SQLite has one writer)
waits at most for one chunk. A deleted row's space is reused by the rows that follow; the SQLite file
itself does not shrink (`VACUUM` does that, offline).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from sqlalchemy import Column, Connection, Engine, Select, Table, delete, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from twin.clock import as_utc, twin_clock
from twin.db import in_chunks
from twin.forecast_store import ForecastScore
from twin.settings import TwinSettings
from twin.store import NODE_STATUS, Job, NodeStatusChange, TelemetryEvent, TelemetryRetention

EVENTS: Table = TelemetryEvent.__table__  # type: ignore[attr-defined]
JOBS: Table = Job.__table__  # type: ignore[attr-defined]
CHANGES: Table = NodeStatusChange.__table__  # type: ignore[attr-defined]
SCORES: Table = ForecastScore.__table__  # type: ignore[attr-defined]
RETENTION: Table = TelemetryRetention.__table__  # type: ignore[attr-defined]

# Rows a transaction deletes: ~10 us each on SQLite, whose one write lock ingest waits for meanwhile
# (bench/retention.py).
CHUNK = 2_000


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune deleted (or, dry, would delete), dated before `kept_from`."""

    cluster_id: str
    kept_from: datetime
    events: int
    node_changes: int
    scores: int

    def describe(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "kept_from": self.kept_from.isoformat(),
            "events": self.events,
            "node_changes": self.node_changes,
            "scores": self.scores,
        }


def pruned(kind: str, ts: datetime, job_ended_at: datetime | None, horizon: datetime) -> bool:
    """Whether a prune to `horizon` deletes an event of this type and time (`_old_events` is the same rule as
    a query): dated before the horizon, a node's report, or an event of a job that ended before it."""
    return ts < horizon and (kind == NODE_STATUS or (job_ended_at is not None and job_ended_at < horizon))


def job_ends(connection: Connection, job_ids: list[str]) -> dict[str, datetime]:
    """When each of these jobs ended, for those that did: what `pruned` asks of an event's job."""
    ended: dict[str, datetime] = {}
    for chunk in in_chunks(job_ids):
        rows = connection.execute(select(JOBS.c.job_id, JOBS.c.ended_at).where(JOBS.c.job_id.in_(chunk)))
        ended.update((job_id, as_utc(end)) for job_id, end in rows if end is not None)
    return ended


def horizons(connection: Connection) -> dict[str, datetime]:
    """Each pruned cluster's horizon (a row per cluster: read whole)."""
    rows = connection.execute(select(RETENTION.c.cluster_id, RETENTION.c.kept_from))
    return {cluster_id: as_utc(kept_from) for cluster_id, kept_from in rows}


def kept_from(engine: Engine, cluster_id: str) -> datetime | None:
    """Where the cluster's telemetry is whole from; None: nothing of it was pruned."""
    with engine.connect() as connection:
        return horizons(connection).get(cluster_id)


def due_horizon(engine: Engine, settings: TwinSettings, *, wall: datetime | None = None) -> datetime | None:
    """The horizon the settings keep now: the twin's clock less FINETWIN_KEEP_TELEMETRY_DAYS. None: they
    keep everything, or the cluster has no telemetry."""
    if not settings.keep_telemetry_days:
        return None
    clock = twin_clock(
        engine, settings.cluster_id, wall=wall, tolerance_s=settings.forecast_clock_tolerance_seconds
    )
    if clock.telemetry_latest is None:
        return None
    return clock.now - timedelta(days=settings.keep_telemetry_days)


def prune(
    engine: Engine, cluster_id: str, before: datetime, *, dry_run: bool = False, chunk: int = CHUNK
) -> Pruned:
    """Delete what the record keeps no longer, dated before `before` (or before the recorded horizon, if
    that is later); `dry_run` counts it instead. The horizon is recorded first, so that ingest refuses what
    would land before it while the rows go."""
    before = as_utc(before)
    recorded = kept_from(engine, cluster_id)
    if recorded is not None and recorded > before:
        before = recorded
    if dry_run:
        with engine.connect() as connection:
            return Pruned(
                cluster_id, before,
                _count(connection, _old_events(cluster_id, before)),
                _count(connection, _old_changes(cluster_id, before)),
                _count(connection, _old_scores(cluster_id, before)),
            )  # fmt: skip
    with engine.begin() as connection:
        _record(connection, cluster_id, before)
    return Pruned(
        cluster_id,
        before,
        _delete_events(engine, cluster_id, before, chunk),
        _delete_changes(engine, cluster_id, before, chunk),
        _delete_scores(engine, cluster_id, before, chunk),
    )


def prune_due(
    engine: Engine, settings: TwinSettings, *, wall: datetime | None = None, dry_run: bool = False
) -> Pruned | None:
    """`prune` to the horizon the settings keep now (the API's schedule, `finetwin prune`); None: they keep
    everything, or there is no telemetry."""
    horizon = due_horizon(engine, settings, wall=wall)
    return None if horizon is None else prune(engine, settings.cluster_id, horizon, dry_run=dry_run)


def _record(connection: Connection, cluster_id: str, before: datetime) -> None:
    """Upsert the cluster's horizon; never back (a concurrent prune to an earlier one leaves it)."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    insert = dialect.insert(RETENTION).values(
        cluster_id=cluster_id, kept_from=before, pruned_at=datetime.now(UTC)
    )
    connection.execute(
        insert.on_conflict_do_update(
            index_elements=["cluster_id"],
            set_={"kept_from": insert.excluded.kept_from, "pruned_at": insert.excluded.pruned_at},
            where=RETENTION.c.kept_from <= insert.excluded.kept_from,
        )
    )


def _old_events(cluster_id: str, before: datetime) -> Select:
    """The events to delete (id, time), oldest first: a job's once it ended before the horizon (joined on the
    jobs' key, one lookup a row), a node's report."""
    return (
        select(EVENTS.c.event_id, EVENTS.c.ts)
        .select_from(EVENTS.outerjoin(JOBS, JOBS.c.job_id == EVENTS.c.job_id))
        .where(
            EVENTS.c.cluster_id == cluster_id,
            EVENTS.c.ts < before,
            or_(EVENTS.c.type == NODE_STATUS, JOBS.c.ended_at < before),
        )
        .order_by(EVENTS.c.ts)
    )


def _delete_events(engine: Engine, cluster_id: str, before: datetime, chunk: int) -> int:
    """Delete `_old_events` a chunk at a time. Each chunk's read starts at the previous one's last time: the
    events it passed over (of jobs still open) are not read again and again."""
    deleted = 0
    since: datetime | None = None
    while True:
        query = _old_events(cluster_id, before).limit(chunk)
        if since is not None:
            query = query.where(EVENTS.c.ts >= since)
        count, last = _delete_chunk(engine, query)
        deleted += count
        if count < chunk:
            return deleted
        since = last


def _delete_chunk(engine: Engine, query: Select) -> tuple[int, datetime | None]:
    """Delete the events `query` selects (id, time); how many, and the latest time among them.

    PostgreSQL deletes them in one statement, without a round trip of their ids (half the time; its row
    locks let ingest write meanwhile). SQLite reads them first, outside the transaction, whose write lock
    ingest waits for."""
    if engine.dialect.name == "postgresql":
        doomed = query.cte("doomed")
        gone = delete(EVENTS).where(EVENTS.c.event_id == doomed.c.event_id).returning(EVENTS.c.ts).cte("gone")
        with engine.begin() as connection:
            count, last = connection.execute(select(func.count(), func.max(gone.c.ts))).one()
        return int(count), last
    with engine.connect() as connection:
        rows = connection.execute(query).all()
    _delete_keys(engine, EVENTS.c.event_id, [str(event_id) for event_id, _ in rows], len(rows) or 1)
    return len(rows), rows[-1][1] if rows else None


def _old_changes(cluster_id: str, before: datetime) -> Select:
    """The nodes' changes dated before the horizon but each node's latest there (its reports of that latest
    time, which the store's order of one time tells apart: `twin.gpus_up`)."""
    newer = CHANGES.alias("newer")
    latest = (
        select(func.max(newer.c.ts))
        .where(newer.c.cluster_id == cluster_id, newer.c.node_id == CHANGES.c.node_id, newer.c.ts < before)
        .scalar_subquery()
    )
    return select(CHANGES.c.event_id).where(
        CHANGES.c.cluster_id == cluster_id, CHANGES.c.ts < before, CHANGES.c.ts < latest
    )


def _delete_changes(engine: Engine, cluster_id: str, before: datetime, chunk: int) -> int:
    with engine.connect() as connection:  # a few rows per node and day
        ids = [str(event_id) for (event_id,) in connection.execute(_old_changes(cluster_id, before))]
    return _delete_keys(engine, CHANGES.c.event_id, ids, chunk)


def _old_scores(cluster_id: str, before: datetime) -> Select:
    """The scores of the UTC days before the horizon's: whole days, which the days' sums stand for
    (`twin.skill_totals`), so a skill window that starts in the horizon's day still reads its scores."""
    midnight = datetime.combine(before.date(), time(), tzinfo=UTC)
    return select(SCORES.c.id).where(SCORES.c.cluster_id == cluster_id, SCORES.c.interval_start < midnight)


def _delete_scores(engine: Engine, cluster_id: str, before: datetime, chunk: int) -> int:
    deleted = 0
    while True:
        with engine.connect() as connection:
            ids = connection.execute(_old_scores(cluster_id, before).limit(chunk)).scalars().all()
        deleted += _delete_keys(engine, SCORES.c.id, list(ids), chunk)
        if len(ids) < chunk:
            return deleted


def _delete_keys(engine: Engine, key: Column, keys: list, chunk: int) -> int:  # type: ignore[type-arg]
    """Delete the rows of `key`'s table with these keys, a transaction per `chunk` of them."""
    deleted = 0
    for start in range(0, len(keys), chunk):
        with engine.begin() as connection:
            for part in in_chunks(keys[start : start + chunk]):
                deleted += connection.execute(delete(key.table).where(key.in_(part))).rowcount
    return deleted


def _count(connection: Connection, query: Select) -> int:
    return int(
        connection.execute(select(func.count()).select_from(query.order_by(None).subquery())).scalar_one()
    )
