"""Applies a batch of validated telemetry events to the store in one transaction.

Each `event_id` is applied once: the raw-event insert skips ids already in the store (and duplicates inside
the batch), and only the events it actually inserted change jobs, observed runs and nodes. Events may arrive
out of order (a completion before its submission): a job row is created by whichever event comes first,
its state never moves backwards, and its configuration is filled in whenever `job.submitted` arrives.

Everything is written with a handful of SQLAlchemy Core bulk statements per batch, never row by row:
INSERT ... ON CONFLICT (the dialect's own) and UPDATE, fed from `unnest()` of binary arrays on PostgreSQL
and by executemany on SQLite. Ingest throughput is bounded by these statements (bench/ingest.py).

Concurrency: workers of one group own disjoint partitions, so they rarely touch the same rows; when a
rebalance makes them overlap, PostgreSQL's ON CONFLICT waits for the other transaction and the job rows are
read FOR UPDATE, in one order (by id) for every writer.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy
from sqlalchemy import JSON, Connection, Engine, Table, Text, any_, bindparam, cast, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError

from ingest.events import MEASURED_FIELDS, Event, JobSubmitted
from twin.store import JOB_STATE_RANK, TERMINAL_STATES, Job, Node, ObservedRun, TelemetryEvent

log = logging.getLogger(__name__)

Stamp = Callable[[datetime], datetime]  # how an event's time is stored on this connection's dialect

# Called inside the batch's transaction, after applying it, with only the events applied for the first time.
BatchHook = Callable[[sqlalchemy.Connection, Sequence[Event]], None]

EVENTS: Table = TelemetryEvent.__table__  # type: ignore[attr-defined]
JOBS: Table = Job.__table__  # type: ignore[attr-defined]
RUNS: Table = ObservedRun.__table__  # type: ignore[attr-defined]
NODES: Table = Node.__table__  # type: ignore[attr-defined]

JOB_COLUMNS: tuple[str, ...] = tuple(c.name for c in JOBS.columns)
CONFIG_FIELDS: tuple[str, ...] = tuple(JobSubmitted.model_fields)
# Bound parameters per IN (...) list: well under SQLite's limit, small enough for PostgreSQL's planner.
_IN_CHUNK = 900
_ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: int  # events applied for the first time
    duplicates: int  # already in the store, or repeated inside the batch
    applied_events: tuple[Event, ...] = ()


def apply_events(
    engine: Engine, events: Sequence[Event], hooks: Sequence[BatchHook] = (), *, attempts: int = 5
) -> ApplyResult:
    """Apply `events` in one transaction of their own, retrying when a concurrent writer gets in the way.

    Two workers can hold the same events for a moment during a consumer-group rebalance; the loser of such a
    race (unique violation, deadlock, serialization failure, a locked SQLite file) rolls back and retries,
    and on the retry sees the winner's rows and skips them.
    """
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as connection:
                return apply_batch(connection, events, hooks)
        except (IntegrityError, OperationalError) as exc:
            if attempt == attempts or not _is_transient(exc):
                raise
            log.warning("batch collided with a concurrent writer (attempt %d): %s", attempt, exc.orig)
            time.sleep(0.05 * attempt)  # back off so the other transaction can finish
    raise AssertionError("unreachable")


def _is_transient(exc: IntegrityError | OperationalError) -> bool:
    if isinstance(exc, IntegrityError):
        return True
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate in ("40001", "40P01", "55P03"):  # serialization failure, deadlock, lock not available
        return True
    return "locked" in str(exc.orig).lower()  # SQLite: database is locked


def apply_batch(
    connection: Connection, events: Sequence[Event], hooks: Sequence[BatchHook] = ()
) -> ApplyResult:
    """Apply `events` inside the caller's transaction; returns what was new and what was a duplicate."""
    unique: dict[str, Event] = {}
    for event in events:
        unique.setdefault(str(event.event_id), event)
    if not unique:
        return ApplyResult(0, len(events))
    now = datetime.now(UTC)
    # SQLite stores a datetime's fields without its offset, so times go in as UTC; psycopg sends the offset.
    stamp: Stamp = _utc if connection.dialect.name == "sqlite" else _as_given
    inserted = _insert_new_events(connection, unique, now, stamp)
    fresh = tuple(event for event_id, event in unique.items() if event_id in inserted)
    job_events: dict[str, list[Event]] = {}
    node_events: list[Event] = []
    for event in fresh:
        if event.type == "node.status":
            node_events.append(event)
        else:
            job_events.setdefault(event.job_id, []).append(event)  # type: ignore[arg-type]
    if job_events:
        _apply_job_events(connection, job_events, now, stamp)
    if node_events:
        _apply_node_events(connection, node_events, stamp)
    for hook in hooks:
        hook(connection, fresh)
    return ApplyResult(len(fresh), len(events) - len(fresh), fresh)


# --- raw events -------------------------------------------------------------------------------------------


def _insert(connection: Connection, table: Table) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT (PostgreSQL and SQLite spell it the same way)."""
    dialect = connection.dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"ingest supports PostgreSQL and SQLite, not {dialect}")


def _bulk(
    connection: Connection, table: Table, rows: list[dict[str, Any]], finish: Callable[[Any], Any], kind: str
) -> Any:
    """Execute `finish(INSERT INTO table ...)` (which adds ON CONFLICT / RETURNING) for all `rows` at once;
    `kind` names what `finish` adds (statements are compiled once per table, columns and kind).

    PostgreSQL gets one short statement whose rows come from `unnest()` of one array per column, the arrays
    sent in binary: the statement's text never changes, whatever the batch size, and nothing is escaped.
    (SQLAlchemy's multi-row VALUES puts a parameter per cell in a text the driver re-parses on each call,
    and psycopg escapes arrays sent as text with a regular expression per element: together ~10x slower.)
    SQLite gets an executemany, which SQLAlchemy batches into multi-row VALUES statements.
    """
    names = tuple(rows[0])
    if connection.dialect.name != "postgresql":
        return connection.execute(finish(_insert(connection, table)), rows)

    def build() -> Any:
        source = _unnest(table, names)
        query = select(*[_from_array(source.c[name], table.c[name]) for name in names])
        return finish(_insert(connection, table).from_select(names, query))

    sql = _pg_sql(connection, ("insert", table.name, names, kind), build)
    return connection.exec_driver_sql(sql, _arrays(table, names, rows))


def _bulk_update(
    connection: Connection, table: Table, key: str, names: tuple[str, ...], rows: list[dict[str, Any]]
) -> None:
    """UPDATE the columns `names` of every row, matched on the `key` column; one statement for all rows
    (PostgreSQL: UPDATE ... FROM unnest(arrays), as in `_bulk`; SQLite: an executemany)."""
    if connection.dialect.name != "postgresql":
        stmt = update(table).where(table.c[key] == bindparam(f"b_{key}"))
        stmt = stmt.values({name: bindparam(f"b_{name}") for name in names})
        connection.execute(stmt, [{f"b_{name}": row[name] for name in (key, *names)} for row in rows])
        return

    def build() -> Any:
        source = _unnest(table, (key, *names))
        values = {name: _from_array(source.c[name], table.c[name]) for name in names}
        return update(table).values(values).where(table.c[key] == source.c[key])

    sql = _pg_sql(connection, ("update", table.name, (key, *names), ""), build)
    connection.exec_driver_sql(sql, _arrays(table, (key, *names), rows))


_PG_SQL: dict[tuple[str, str, tuple[str, ...], str], str] = {}


def _pg_sql(
    connection: Connection, key: tuple[str, str, tuple[str, ...], str], build: Callable[[], Any]
) -> str:
    """The statement `build()` makes, compiled once; its array parameters are sent in binary (`%(name)b`:
    SQLAlchemy always writes `%(name)s`, which lets psycopg choose text for arrays of strings)."""
    if key not in _PG_SQL:
        compiled = str(build().compile(dialect=connection.dialect))
        _PG_SQL[key] = re.sub(r"%\((c_\w+)\)s", r"%(\1)b", compiled)
    return _PG_SQL[key]


def _unnest(table: Table, names: tuple[str, ...]) -> Any:
    """`unnest(%(c_a)s, %(c_b)s, ...) AS src(a, b, ...)`: one array parameter per column."""
    arrays = [bindparam(f"c_{name}", type_=_array_type(table.c[name])) for name in names]
    return func.unnest(*arrays).table_valued(*names).render_derived(name="src")


def _arrays(table: Table, names: tuple[str, ...], rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {
        f"c_{name}": [_json_text(row[name]) for row in rows]
        if isinstance(table.c[name].type, JSON)
        else [row[name] for row in rows]
        for name in names
    }


def _array_type(column: Any) -> postgresql.ARRAY:
    # JSON travels as text and is cast back: psycopg cannot infer a JSON array's element type.
    element = Text() if isinstance(column.type, JSON) else column.type
    return postgresql.ARRAY(element)


class _JsonText(str):
    """A value already serialized to JSON text."""


def _json_text(value: Any) -> str | None:
    if value is None or isinstance(value, _JsonText):
        return value
    return json.dumps(value)


def _from_array(selected: Any, column: Any) -> Any:
    return cast(selected, column.type) if isinstance(column.type, JSON) else selected


def _insert_new_events(
    connection: Connection, unique: dict[str, Event], now: datetime, stamp: Stamp
) -> set[str]:
    """Insert the raw events the store does not have yet; returns the ids actually inserted."""
    # PostgreSQL takes the payload as JSON text, serialized by pydantic (several times faster than
    # json.dumps of a dict); SQLAlchemy serializes the dict itself for SQLite.
    as_text = connection.dialect.name == "postgresql"
    rows = [
        {
            "event_id": event_id,
            "type": event.type,
            "ts": stamp(event.ts),
            "cluster_id": event.cluster_id,
            "job_id": event.job_id,
            "payload": _JsonText(event.payload.model_dump_json())
            if as_text
            else event.payload.model_dump(mode="json"),
            "received_at": now,
        }
        for event_id, event in sorted(unique.items())  # one lock order for every writer: no deadlocks
    ]
    result = _bulk(
        connection, EVENTS, rows,
        lambda insert: insert.on_conflict_do_nothing(index_elements=["event_id"])
        .returning(EVENTS.c.event_id),
        "insert-new",
    )  # fmt: skip
    return set(result.scalars())


# --- jobs -------------------------------------------------------------------------------------------------


def _apply_job_events(
    connection: Connection, job_events: dict[str, list[Event]], now: datetime, stamp: Stamp
) -> None:
    job_ids = sorted(job_events)
    current = _lock_jobs(connection, job_ids)
    stored = {job_id: dict(row) for job_id, row in current.items()}  # as they were, to see what changed
    new_ids = [job_id for job_id in job_ids if job_id not in current]
    runs: list[dict[str, Any]] = []
    merged: dict[str, dict[str, Any]] = {}
    for job_id in job_ids:
        row = current.get(job_id) or _empty_job(job_id, job_events[job_id][0].cluster_id)
        for event in job_events[job_id]:
            run = _fold(row, event, stamp)
            if run is not None:
                runs.append(run)
        row["updated_at"] = now
        merged[job_id] = row
    if new_ids:
        # A concurrent worker may create the same job between our SELECT and this INSERT; the ids it took
        # are re-read under lock and folded again, so neither worker's events are lost.
        result = _bulk(
            connection, JOBS, [merged[job_id] for job_id in new_ids],
            lambda insert: insert.on_conflict_do_nothing(index_elements=["job_id"]).returning(JOBS.c.job_id),
            "insert-new",
        )  # fmt: skip
        created = set(result.scalars())
        raced = [job_id for job_id in new_ids if job_id not in created]
        if raced:
            _refold_raced_jobs(connection, raced, job_events, merged, runs, now, stamp)
    existing = [merged[job_id] for job_id in job_ids if job_id in stored]
    if existing:
        # Only the columns some event changed: a batch of progress reports rewrites 5 columns, not 33.
        changed = {
            name for row in existing for name, value in row.items() if value != stored[row["job_id"]][name]
        }
        _bulk_update(
            connection, JOBS, "job_id", tuple(name for name in JOB_COLUMNS if name in changed), existing
        )
    if runs:
        _bulk(
            connection,
            RUNS,
            runs,
            lambda insert: insert.on_conflict_do_nothing(index_elements=["job_id"]),
            "insert-new",
        )


def _refold_raced_jobs(
    connection: Connection, raced: list[str], job_events: dict[str, list[Event]],
    merged: dict[str, dict[str, Any]], runs: list[dict[str, Any]], now: datetime, stamp: Stamp,
) -> None:  # fmt: skip
    runs[:] = [run for run in runs if run["job_id"] not in set(raced)]
    current = _lock_jobs(connection, raced)
    rows = []
    for job_id in raced:
        row = current[job_id]
        for event in job_events[job_id]:
            run = _fold(row, event, stamp)
            if run is not None:
                runs.append(run)
        row["updated_at"] = now
        merged[job_id] = row
        rows.append(row)
    _bulk_update(connection, JOBS, "job_id", tuple(name for name in JOB_COLUMNS if name != "job_id"), rows)


def _lock_jobs(connection: Connection, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored rows of these jobs, locked until the transaction ends (PostgreSQL; SQLite holds the whole
    database's write lock already, since the raw-event insert came first)."""
    found: dict[str, dict[str, Any]] = {}
    if connection.dialect.name == "postgresql":  # one array parameter, not one parameter per id
        ids = bindparam("job_ids", job_ids, type_=postgresql.ARRAY(Text()))
        chunks = [JOBS.c.job_id == any_(ids)]
    else:
        chunks = [JOBS.c.job_id.in_(job_ids[i : i + _IN_CHUNK]) for i in range(0, len(job_ids), _IN_CHUNK)]
    for condition in chunks:
        query = select(JOBS).where(condition).order_by(JOBS.c.job_id).with_for_update()
        for row in connection.execute(query).mappings():
            found[row["job_id"]] = dict(row)
    return found


def _empty_job(job_id: str, cluster_id: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(JOB_COLUMNS)
    row.update(job_id=job_id, cluster_id=cluster_id, state="unknown")
    return row


def _advance(row: dict[str, Any], state: str) -> bool:
    """Move the job to `state` unless it is already as far along; a terminal state is final."""
    current = row["state"] or "unknown"
    if current in TERMINAL_STATES or JOB_STATE_RANK[state] <= JOB_STATE_RANK.get(current, 0):
        return False
    row["state"] = state
    return True


def _earliest(current: datetime | None, ts: datetime) -> datetime:
    if current is None:
        return ts
    current = current if current.tzinfo is not None else current.replace(tzinfo=UTC)  # SQLite: naive UTC
    return min(current, ts)


def _fold(row: dict[str, Any], event: Event, stamp: Stamp) -> dict[str, Any] | None:
    """Apply one event to a job row in place; returns the observed run it completes, if any."""
    ts = stamp(event.ts)
    payload = event.payload
    kind = event.type
    if kind == "job.submitted":
        row.update(payload.model_dump(include=set(CONFIG_FIELDS)))
        row["cluster_id"] = event.cluster_id
        row["submitted_at"] = _earliest(row["submitted_at"], ts)
        _advance(row, "submitted")
    elif kind == "job.started":
        row["started_at"] = _earliest(row["started_at"], ts)
        row["node_ids"] = list(payload.node_ids)  # type: ignore[union-attr]
        _advance(row, "running")
    elif kind == "job.progress":
        # Work done only grows, so the furthest report is the latest one, whatever order they came in.
        if row["tokens_processed"] is None or payload.tokens_processed >= row["tokens_processed"]:  # type: ignore[union-attr]
            row["tokens_processed"] = payload.tokens_processed  # type: ignore[union-attr]
            row["last_tokens_per_second"] = payload.tokens_per_second  # type: ignore[union-attr]
            row["last_gpu_memory_peak_pct"] = payload.gpu_memory_peak_pct  # type: ignore[union-attr]
            row["last_power_watts"] = payload.power_watts  # type: ignore[union-attr]
    elif kind == "job.rejected":
        if _advance(row, "rejected"):
            row.update(outcome="rejected", rule=str(payload.rule), ended_at=ts)  # type: ignore[union-attr]
    elif kind == "job.completed":
        if _advance(row, "completed"):
            row.update(outcome="valid", ended_at=ts)
            measured = payload.model_dump(include=set(MEASURED_FIELDS))
            return {"job_id": row["job_id"], "is_valid": 1, "observed_at": ts, **measured}
    elif kind == "job.failed" and _advance(row, "failed"):
        row.update(
            outcome="runtime", ended_at=ts, failure_reason=payload.reason,  # type: ignore[union-attr]
            failed_after_s=payload.seconds_into_run,  # type: ignore[union-attr]
        )  # fmt: skip
        return {"job_id": row["job_id"], "is_valid": 0, "observed_at": ts, **dict.fromkeys(MEASURED_FIELDS)}
    return None


# --- nodes ------------------------------------------------------------------------------------------------


def _apply_node_events(connection: Connection, events: Iterable[Event], stamp: Stamp) -> None:
    """Upsert each node's latest status; `updated_at` is the status's own time, so an older report that
    arrives late does not overwrite a newer one."""
    latest: dict[str, dict[str, Any]] = {}
    for event in events:
        payload = event.payload
        row = {
            "node_id": payload.node_id,  # type: ignore[union-attr]
            "cluster_id": event.cluster_id,
            "gpu_model": payload.gpu_model,  # type: ignore[union-attr]
            "gpu_count": payload.gpu_count,  # type: ignore[union-attr]
            "status": payload.status,  # type: ignore[union-attr]
            "updated_at": stamp(event.ts),
        }
        before = latest.get(row["node_id"])
        if before is None or row["updated_at"] >= before["updated_at"]:
            latest[row["node_id"]] = row
    updated = ("cluster_id", "gpu_model", "gpu_count", "status", "updated_at")
    _bulk(
        connection, NODES, [latest[node_id] for node_id in sorted(latest)],
        lambda insert: insert.on_conflict_do_update(
            index_elements=["node_id"],
            set_={name: insert.excluded[name] for name in updated},
            where=NODES.c.updated_at <= insert.excluded.updated_at,
        ),
        "upsert-newer",
    )  # fmt: skip


def _as_given(ts: datetime) -> datetime:
    return ts


def _utc(ts: datetime) -> datetime:
    """Aware and in UTC; SQLite hands back naive datetimes, which are UTC because only UTC is written."""
    if ts.tzinfo is None:
        return ts.replace(tzinfo=UTC)
    return ts if ts.utcoffset() == _ZERO else ts.astimezone(UTC)  # most events are UTC already: keep them
