"""Applies a batch of validated telemetry events to the store in one transaction.

Each `event_id` is applied once: the raw-event insert skips ids already in the store (and duplicates inside
the batch), and only the events it actually inserted change jobs, observed runs and nodes. Events may arrive
out of order (a completion before its submission): a job row is created by whichever event comes first,
its state never moves backwards, and its configuration is filled in whenever `job.submitted` arrives.

Everything is written with a handful of SQLAlchemy Core bulk statements per batch, never row by row:
INSERT ... ON CONFLICT (the dialect's own) and UPDATE, fed on PostgreSQL from one JSON document per
statement (`json_populate_recordset`, the document encoded by msgspec in one call) and by executemany on
SQLite. Ingest throughput is bounded by these statements and by decoding (bench/ingest.py).

Events are the validated pydantic events of `ingest.events` or their msgspec mirrors from the worker's fast
path (`ingest.fastparse`); both are read the same way here, and hooks get whichever they were given.

Concurrency: workers of one group own disjoint partitions, so they rarely touch the same rows; when a
rebalance makes them overlap, PostgreSQL's ON CONFLICT waits for the other transaction and the job rows are
read FOR UPDATE, in one order (by id) for every writer.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import sqlalchemy
from psycopg.types.json import Json
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, Table, Text, any_, bindparam, func, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError

from ingest.events import MEASURED_FIELDS, Event
from ingest.fastparse import FastEvent
from twin.store import JOB_STATE_RANK, TERMINAL_STATES, Job, Node, ObservedRun, TelemetryEvent

log = logging.getLogger(__name__)

Stamp = Callable[[datetime], datetime]  # how an event's time is stored on this connection's dialect

AnyEvent = Event | FastEvent  # a validated event, from `parse_event` or from the worker's fast path

# Called inside the batch's transaction, after applying it, with only the events applied for the first time.
BatchHook = Callable[[sqlalchemy.Connection, Sequence[AnyEvent]], None]

EVENTS: Table = TelemetryEvent.__table__  # type: ignore[attr-defined]
JOBS: Table = Job.__table__  # type: ignore[attr-defined]
RUNS: Table = ObservedRun.__table__  # type: ignore[attr-defined]
NODES: Table = Node.__table__  # type: ignore[attr-defined]

JOB_COLUMNS: tuple[str, ...] = tuple(c.name for c in JOBS.columns)
# Bound parameters per IN (...) list: well under SQLite's limit, small enough for PostgreSQL's planner.
_IN_CHUNK = 900
_ZERO = timedelta(0)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: int  # events applied for the first time
    duplicates: int  # already in the store, or repeated inside the batch
    applied_events: tuple[AnyEvent, ...] = ()


def apply_events(
    engine: Engine, events: Sequence[AnyEvent], hooks: Sequence[BatchHook] = (), *, attempts: int = 5
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
    connection: Connection, events: Sequence[AnyEvent], hooks: Sequence[BatchHook] = ()
) -> ApplyResult:
    """Apply `events` inside the caller's transaction; returns what was new and what was a duplicate."""
    unique: dict[int, AnyEvent] = {}  # by the event id's 128-bit value: no text to format and compare
    for event in events:
        unique.setdefault(event.event_id.int, event)
    if not unique:
        return ApplyResult(0, len(events))
    now = datetime.now(UTC)
    # SQLite stores a datetime's fields without its offset, so times go in as UTC; psycopg sends the offset.
    stamp: Stamp = _utc if connection.dialect.name == "sqlite" else _as_given
    inserted = _insert_new_events(connection, unique, now, stamp)
    fresh = tuple(event for key, event in unique.items() if key in inserted)  # in the order they came
    job_events: dict[str, list[AnyEvent]] = {}
    node_events: list[AnyEvent] = []
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

    PostgreSQL gets one short statement whose rows come from a single JSON document: the statement's text
    never changes, whatever the batch size, and the client's work is one msgspec call for the whole batch.
    (Binary arrays, one per column, cost psycopg ~1 µs of Python per cell: a 33-column job row took 30 µs.)
    SQLite gets an executemany, which SQLAlchemy batches into multi-row VALUES statements.
    """
    names = tuple(rows[0])
    if connection.dialect.name != "postgresql":
        return connection.execute(finish(_insert(connection, table)), rows)

    def build() -> Any:
        source = _recordset(connection, table)
        return finish(_insert(connection, table).from_select(names, select(*[source.c[n] for n in names])))

    sql = _pg_sql(connection, ("insert", table.name, names, kind), build)
    return connection.exec_driver_sql(sql, {"rows": _json_rows(rows)})


def _bulk_update(
    connection: Connection, table: Table, key: str, names: tuple[str, ...], rows: list[dict[str, Any]]
) -> None:
    """UPDATE the columns `names` of every row, matched on the `key` column; one statement for all rows
    (PostgreSQL: UPDATE ... FROM the rows' JSON document, as in `_bulk`; SQLite: an executemany)."""
    if connection.dialect.name != "postgresql":
        stmt = update(table).where(table.c[key] == bindparam(f"b_{key}"))
        stmt = stmt.values({name: bindparam(f"b_{name}") for name in names})
        connection.execute(stmt, [{f"b_{name}": row[name] for name in (key, *names)} for row in rows])
        return

    def build() -> Any:
        source = _recordset(connection, table)
        values = {name: source.c[name] for name in names}
        return update(table).values(values).where(table.c[key] == source.c[key])

    sql = _pg_sql(connection, ("update", table.name, (key, *names), ""), build)
    connection.exec_driver_sql(sql, {"rows": _json_rows(rows)})


_PG_SQL: dict[tuple[str, str, tuple[str, ...], str], str] = {}


def _pg_sql(
    connection: Connection, key: tuple[str, str, tuple[str, ...], str], build: Callable[[], Any]
) -> str:
    """The statement `build()` makes, compiled once."""
    if key not in _PG_SQL:
        _PG_SQL[key] = str(build().compile(dialect=connection.dialect))
    return _PG_SQL[key]


def _recordset(connection: Connection, table: Table) -> Any:
    """`json_populate_recordset(NULL::table, %(rows)s) AS src`: the rows of a JSON array of objects, as
    rows of `table` (PostgreSQL converts each value to its column's type; keys it does not know are
    ignored, missing ones are NULL)."""
    row_type = literal_column(f"NULL::{connection.dialect.identifier_preparer.format_table(table)}")
    columns = [column.name for column in table.columns]
    return func.json_populate_recordset(row_type, bindparam("rows")).table_valued(*columns).alias("src")


_ENCODER = msgspec.json.Encoder(enc_hook=lambda value: _to_builtins(value))


def _to_builtins(value: Any) -> Any:
    """What msgspec cannot encode by itself: pydantic events and payloads (from `parse_event`)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _json_rows(rows: Sequence[Any]) -> Json:
    """The rows as one JSON document, ready to send (psycopg's JSON parameter, with msgspec's bytes)."""
    try:
        document = _ENCODER.encode(rows)
    except OverflowError:
        # An integer beyond 64 bits (pydantic takes any size): let PostgreSQL refuse it, as it would refuse
        # a smaller one too big for its column, so that the event is dead-lettered with its reason.
        document = json.dumps(rows, default=_json_default).encode()
    return Json(document, dumps=_already_json)


def _already_json(document: bytes) -> bytes:
    return document


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | uuid.UUID):
        return str(value)
    return _to_builtins(value)


# Floats the contract lets be inf or nan (`JobCompleted.model_load_time`, unconstrained there). JSON cannot
# spell them, and msgspec writes null; PostgreSQL reads its own spellings from a JSON string instead.
_NON_FINITE_COLUMNS = ("model_load_time",)


def _spell_non_finite(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        for name in _NON_FINITE_COLUMNS:
            value = row.get(name)
            if value is not None and not math.isfinite(value):
                row[name] = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _insert_new_events(
    connection: Connection, unique: dict[int, AnyEvent], now: datetime, stamp: Stamp
) -> set[int]:
    """Insert the raw events the store does not have yet; returns the ids (as ints) actually inserted."""
    ordered = [unique[key] for key in sorted(unique)]  # one lock order for every writer: no deadlocks
    if connection.dialect.name == "postgresql":
        # The events themselves are the JSON rows: their envelope fields are the table's columns, and the
        # payload lands in its JSON column as it is.
        key = ("insert", EVENTS.name, (), "new-events")
        sql = _pg_sql(connection, key, lambda: _events_from_json(connection))
        result = connection.exec_driver_sql(sql, {"rows": _json_rows(ordered), "received_at": now})
        return {event_id.int for event_id in result.scalars()}
    rows = [
        {
            "event_id": str(event.event_id),
            "type": event.type,
            "ts": stamp(event.ts),
            "cluster_id": event.cluster_id,
            "job_id": event.job_id,
            "payload": _payload_builtins(event.payload),
            "received_at": now,
        }
        for event in ordered
    ]
    result = _bulk(
        connection, EVENTS, rows,
        lambda insert: insert.on_conflict_do_nothing(index_elements=["event_id"])
        .returning(EVENTS.c.event_id),
        "insert-new",
    )  # fmt: skip
    return {uuid.UUID(event_id).int for event_id in result.scalars()}


def _events_from_json(connection: Connection) -> Any:
    """INSERT the events of a JSON document, received now, unless their id is in the store already."""
    source = _recordset(connection, EVENTS)
    copied = [column.name for column in EVENTS.columns if column.name != "received_at"]
    query = select(*[source.c[name] for name in copied], bindparam("received_at"))
    insert = postgresql.insert(EVENTS).from_select([*copied, "received_at"], query)
    return insert.on_conflict_do_nothing(index_elements=["event_id"]).returning(EVENTS.c.event_id)


def _payload_builtins(payload: Any) -> dict[str, Any]:
    """The payload as JSON-ready builtins (SQLite's JSON column serializes them itself)."""
    if isinstance(payload, BaseModel):
        return payload.model_dump(mode="json")
    return msgspec.to_builtins(payload)  # type: ignore[no-any-return]


def _payload_fields(payload: Any) -> dict[str, Any]:
    """Every field of a payload, as Python values (an enum stays an enum, a time a datetime)."""
    if isinstance(payload, msgspec.Struct):
        return msgspec.structs.asdict(payload)
    return dict(payload)  # a pydantic model iterates as (field, value) pairs


# --- jobs -------------------------------------------------------------------------------------------------


def _apply_job_events(
    connection: Connection, job_events: dict[str, list[AnyEvent]], now: datetime, stamp: Stamp
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
        if connection.dialect.name == "postgresql":
            _spell_non_finite(runs)
        _bulk(
            connection,
            RUNS,
            runs,
            lambda insert: insert.on_conflict_do_nothing(index_elements=["job_id"]),
            "insert-new",
        )


def _refold_raced_jobs(
    connection: Connection, raced: list[str], job_events: dict[str, list[AnyEvent]],
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


def _fold(row: dict[str, Any], event: AnyEvent, stamp: Stamp) -> dict[str, Any] | None:
    """Apply one event to a job row in place; returns the observed run it completes, if any."""
    ts = stamp(event.ts)
    payload = event.payload
    kind = event.type
    if kind == "job.submitted":
        row.update(_payload_fields(payload))
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
            measured = _payload_fields(payload)
            return {"job_id": row["job_id"], "is_valid": 1, "observed_at": ts, **measured}
    elif kind == "job.failed" and _advance(row, "failed"):
        row.update(
            outcome="runtime", ended_at=ts, failure_reason=payload.reason,  # type: ignore[union-attr]
            failed_after_s=payload.seconds_into_run,  # type: ignore[union-attr]
        )  # fmt: skip
        return {"job_id": row["job_id"], "is_valid": 0, "observed_at": ts, **dict.fromkeys(MEASURED_FIELDS)}
    return None


# --- nodes ------------------------------------------------------------------------------------------------


def _apply_node_events(connection: Connection, events: Iterable[AnyEvent], stamp: Stamp) -> None:
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
