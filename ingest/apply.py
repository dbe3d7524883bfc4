"""Applies a batch of validated telemetry events to the store in one transaction.

Each `event_id` is applied once: the raw-event insert skips ids already in the store (and duplicates inside
the batch), and only the events it actually inserted change jobs, observed runs and nodes. Events may arrive
out of order (a completion before its submission): a job row is created by whichever event comes first,
its state never moves backwards, and its configuration is filled in whenever `job.submitted` arrives. An
event the job contradicts (another cluster's, or a second submission with another configuration) raises
ConflictingEvent, and the worker dead-letters it (`conflict`).

Everything is written with a handful of bulk statements per batch, never row by row: INSERT ... ON CONFLICT
(the dialect's own) and UPDATE, fed on PostgreSQL from a binary COPY into a staging table and on SQLite by
executemany (`ingest.bulk`). Ingest throughput is bounded by these statements and by decoding
(bench/ingest.py).

Events are the validated pydantic events of `ingest.events` or their msgspec mirrors from the worker's fast
path (`ingest.fastparse`); both are read the same way here, and hooks get whichever they were given.

Concurrency: workers of one group own disjoint partitions, so they rarely touch the same rows; when a
rebalance makes them overlap, PostgreSQL's unique keys make the second writer wait for the first one's
transaction (then skip what it committed), and the job rows are read FOR UPDATE, in one order (by id) for
every writer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any

import msgspec
import sqlalchemy
from psycopg.types.json import Json
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, Table, func, select
from sqlalchemy.exc import IntegrityError, OperationalError

from ingest import node_changes
from ingest.bulk import insert_new_rows, insert_rows, select_locked, update_rows
from ingest.events import MEASURED_FIELDS, Event
from ingest.fastparse import FastEvent
from twin import job_fold, retention
from twin.clock import as_utc
from twin.db import in_chunks
from twin.gpus_up import NodeReport
from twin.store import Job, Node, ObservedRun, TelemetryEvent

log = logging.getLogger(__name__)

Stamp = Callable[[datetime], datetime]  # how an event's time is stored on this connection's dialect

AnyEvent = Event | FastEvent  # a validated event, from `parse_event` or from the worker's fast path

# Called inside the batch's transaction, after applying it, with only the events applied for the first time.
BatchHook = Callable[[sqlalchemy.Connection, Sequence[AnyEvent]], None]

EVENTS: Table = TelemetryEvent.__table__  # type: ignore[attr-defined]
JOBS: Table = Job.__table__  # type: ignore[attr-defined]
RUNS: Table = ObservedRun.__table__  # type: ignore[attr-defined]
NODES: Table = Node.__table__  # type: ignore[attr-defined]

EVENT_COLUMNS: tuple[str, ...] = tuple(c.name for c in EVENTS.columns)
JOB_COLUMNS: tuple[str, ...] = tuple(c.name for c in JOBS.columns)
_ZERO = timedelta(0)
_NOTHING_MEASURED = dict.fromkeys(MEASURED_FIELDS)  # a failed run's measured columns


@dataclass(frozen=True, slots=True)
class ApplyResult:
    applied: int  # events applied for the first time
    duplicates: int  # already in the store, or repeated inside the batch
    applied_events: tuple[AnyEvent, ...] = ()
    # Dated before their cluster's retention horizon where the store no longer holds their neighbours, with
    # why (`_before_retention`): not applied; the worker dead-letters them.
    stale: tuple[tuple[AnyEvent, str], ...] = ()


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
    stale = _before_retention(connection, unique)
    if not unique:
        return ApplyResult(0, len(events) - len(stale), (), tuple(stale))
    known = _insert_new_events(connection, unique, now, stamp)
    fresh = tuple(event for key, event in unique.items() if key not in known)  # in the order they came
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
        _apply_node_events(connection, node_events)
    for hook in hooks:
        hook(connection, fresh)
    return ApplyResult(len(fresh), len(events) - len(fresh) - len(stale), fresh, tuple(stale))


def _before_retention(connection: Connection, unique: dict[int, AnyEvent]) -> list[tuple[AnyEvent, str]]:
    """Takes out of `unique`, with why, the events dated before their cluster's retention horizon
    (`twin.retention`) whose neighbours the store pruned: a node's report, which is ordered among the node's
    reports, and an event of a job that ended before the horizon (a redelivery, most likely: stored again,
    it would be applied again, its first copy gone). An event of a job still open then, or of one the store
    has not seen, is applied: its job's events are all kept. One read of a small table per batch."""
    horizons = retention.horizons(connection)
    old = {
        key: (event, horizon)
        for key, event in unique.items()
        if (horizon := horizons.get(event.cluster_id)) is not None and event.ts < horizon
    }
    if not old:
        return []
    ended = retention.job_ends(
        connection, sorted({e.job_id for e, _ in old.values() if e.job_id is not None})
    )
    stale = []
    for key, (event, horizon) in old.items():
        end = ended.get(event.job_id or "")
        if not retention.pruned(event.type, event.ts, end, horizon):
            continue
        kept = f"the store keeps cluster {event.cluster_id!r}'s telemetry from {horizon.isoformat()} on"
        if end is None:  # a node's report
            why = (
                f"a node's report dated {event.ts.isoformat()}: {kept}, and the node's older reports are gone"
            )
        else:
            why = (
                f"dated {event.ts.isoformat()}, of job {event.job_id!r}, which ended {end.isoformat()}: "
                f"{kept}, and the job's events before it were pruned"
            )
        del unique[key]
        stale.append((event, why + " (FINETWIN_KEEP_TELEMETRY_DAYS)"))
    return stale


# --- raw events -------------------------------------------------------------------------------------------


def _insert_new_events(
    connection: Connection, unique: dict[int, AnyEvent], now: datetime, stamp: Stamp
) -> set[int]:
    """Insert the raw events the store does not have yet; returns the ids (as ints) it already had."""
    ordered = [unique[key] for key in sorted(unique)]  # one lock order for every writer: no deadlocks
    if connection.dialect.name == "postgresql":  # native UUIDs, times as given, payloads as JSON text
        rows = [
            (e.event_id, e.type, e.ts, e.cluster_id, e.job_id, _payload_json(e.payload), now) for e in ordered
        ]
    else:  # SQLite: text ids, UTC times, payloads serialized by the column type
        rows = [
            (str(e.event_id), e.type, stamp(e.ts), e.cluster_id, e.job_id, _payload_builtins(e.payload), now)
            for e in ordered
        ]
    return {
        _id_value(event_id)
        for event_id in insert_new_rows(connection, EVENTS, EVENT_COLUMNS, rows, "event_id")
    }


def _id_value(event_id: uuid.UUID | str) -> int:
    return event_id.int if isinstance(event_id, uuid.UUID) else uuid.UUID(event_id).int


_PAYLOAD_ENCODER = msgspec.json.Encoder()


def _payload_json(payload: Any) -> Json:
    """A payload as JSON text for PostgreSQL's JSON column (a fast-path struct by msgspec, a pydantic model
    by pydantic; both write what the model holds, defaults included)."""
    if isinstance(payload, BaseModel):
        return Json(payload.model_dump_json().encode(), dumps=_as_is)
    return Json(_PAYLOAD_ENCODER.encode(payload), dumps=_as_is)


def _as_is(document: bytes) -> bytes:
    return document


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


def _tuples(rows: list[dict[str, Any]], names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Each row's values in the order of `names` (what `ingest.bulk` takes)."""
    if len(names) == 1:  # itemgetter of one name gives a value, not a 1-tuple
        return [(row[names[0]],) for row in rows]
    values = itemgetter(*names)
    return [values(row) for row in rows]


def _insert_dicts(
    connection: Connection, table: Table, rows: list[dict[str, Any]], finish: Any, kind: str
) -> Any:
    names = tuple(rows[0])
    return insert_rows(connection, table, names, _tuples(rows, names), finish, kind)


def _insert_new_dicts(
    connection: Connection, table: Table, rows: list[dict[str, Any]], key: str
) -> list[Any]:
    """Insert the rows whose `key` is not in `table` yet; returns the keys of those that were."""
    names = tuple(rows[0])
    return insert_new_rows(connection, table, names, _tuples(rows, names), key)


def _update_dicts(
    connection: Connection,
    table: Table,
    key: str,
    names: tuple[str, ...],
    rows: list[dict[str, Any]],
    kind: str,
) -> None:
    update_rows(connection, table, key, names, _tuples(rows, (key, *names)), kind)


# --- jobs -------------------------------------------------------------------------------------------------


def _apply_job_events(
    connection: Connection, job_events: dict[str, list[AnyEvent]], now: datetime, stamp: Stamp
) -> None:
    job_ids = sorted(job_events)
    current = _lock_jobs(connection, job_ids)
    stored = {job_id: dict(row) for job_id, row in current.items()}  # as they were, to see what changed
    new_ids = [job_id for job_id in job_ids if job_id not in current]
    runs: dict[str, dict[str, Any] | None] = {}
    merged: dict[str, dict[str, Any]] = {}
    for job_id in job_ids:
        row = current.get(job_id) or _empty_job(job_id, job_events[job_id][0].cluster_id)
        _fold_job(connection, row, job_events[job_id], stamp, runs)
        row["updated_at"] = now
        merged[job_id] = row
    if new_ids:
        # A concurrent worker may create the same job between our SELECT and this INSERT; the ids it took
        # are re-read under lock and folded again, so neither worker's events are lost.
        raced = _insert_new_dicts(connection, JOBS, [merged[job_id] for job_id in new_ids], "job_id")
        if raced:
            _refold_raced_jobs(connection, raced, job_events, merged, runs, now, stamp)
    existing = [merged[job_id] for job_id in job_ids if job_id in stored]
    if existing:
        # Only the columns some event changed: a batch of progress reports rewrites 6 columns, not 35.
        changed = {
            name for row in existing for name, value in row.items() if value != stored[row["job_id"]][name]
        }
        names = tuple(name for name in JOB_COLUMNS if name in changed)
        _update_dicts(connection, JOBS, "job_id", names, existing, "changed")
    if runs:
        _record_runs(connection, runs)


def _record_runs(connection: Connection, runs: dict[str, dict[str, Any] | None]) -> None:
    """The run of the terminal event that now ends each job: one dated before the job's stored end
    replaces the run recorded for it, and a rejection leaves the job none (twin.job_fold)."""
    recorded = [run for run in runs.values() if run is not _NO_RUN]
    if recorded:
        measured = [name for name in recorded[0] if name != "job_id"]
        _insert_dicts(
            connection, RUNS, recorded,
            lambda insert: insert.on_conflict_do_update(
                index_elements=["job_id"], set_={name: insert.excluded[name] for name in measured}
            ),
            "replace",
        )  # fmt: skip
    rejected = [job_id for job_id, run in runs.items() if run is _NO_RUN]
    for chunk in in_chunks(rejected):
        connection.execute(sqlalchemy.delete(RUNS).where(RUNS.c.job_id.in_(chunk)))


def _fold_job(
    connection: Connection, row: dict[str, Any], events: list[AnyEvent], stamp: Stamp,
    runs: dict[str, dict[str, Any] | None],
) -> None:  # fmt: skip
    """Fold `events` into the job's row; the run of a terminal event that now ends the job into `runs`
    (_NO_RUN for a rejection)."""
    for event in events:
        run = _fold(row, event, stamp)
        if run is not _NOT_ENDED:
            runs[row["job_id"]] = run
    if job_fold.progress_after_end(row):
        _refold_progress(connection, row)


def _refold_progress(connection: Connection, row: dict[str, Any]) -> None:
    """The job's progress again, from its stored reports dated by its end: the one it held came before an
    earlier end did. (Rare: a terminal event delivered after a report dated later than it.)"""
    job_fold.forget_progress(row)
    reports = connection.execute(
        select(EVENTS.c.ts, EVENTS.c.payload).where(
            EVENTS.c.job_id == row["job_id"], EVENTS.c.type == "job.progress", EVENTS.c.ts <= row["ended_at"]
        )
    )
    for ts, payload in reports:
        job_fold.fold_progress(
            row, as_utc(ts), payload["tokens_processed"], payload["tokens_per_second"],
            payload.get("gpu_memory_peak_pct"), payload.get("power_watts"),
        )  # fmt: skip


def _refold_raced_jobs(
    connection: Connection, raced: list[str], job_events: dict[str, list[AnyEvent]],
    merged: dict[str, dict[str, Any]], runs: dict[str, dict[str, Any] | None], now: datetime, stamp: Stamp,
) -> None:  # fmt: skip
    for job_id in raced:
        runs.pop(job_id, None)
    current = _lock_jobs(connection, raced)
    rows = []
    for job_id in raced:
        row = current[job_id]
        _fold_job(connection, row, job_events[job_id], stamp, runs)
        row["updated_at"] = now
        merged[job_id] = row
        rows.append(row)
    _update_dicts(connection, JOBS, "job_id", tuple(n for n in JOB_COLUMNS if n != "job_id"), rows, "raced")


def _lock_jobs(connection: Connection, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The stored rows of these jobs, locked until the transaction ends (PostgreSQL; SQLite holds the whole
    database's write lock already, since the raw-event insert came first)."""
    rows = select_locked(connection, [JOBS], JOBS.c.job_id, job_ids)
    return {row.job_id: dict(row._mapping) for row in rows}


def _empty_job(job_id: str, cluster_id: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(JOB_COLUMNS)
    row.update(job_id=job_id, cluster_id=cluster_id, state="unknown")
    return row


class ConflictingEvent(ValueError):
    """A valid event the store's job contradicts: another cluster's job of the same id, or a configuration
    other than the one the job was submitted with. The worker dead-letters it (`conflict`), alone."""


# What `_fold` says of a terminal event that now ends the job: the observed run it records, or that the job
# has none (a rejection ended it, in place of a run recorded before).
_NO_RUN = None
_NOT_ENDED = object()  # the event did not end the job (or was not a terminal event)


def _fold(row: dict[str, Any], event: AnyEvent, stamp: Stamp) -> Any:
    """Apply one event to a job row in place, by the rules of `twin.job_fold`. A terminal event that now
    ends the job returns the job's observed run (_NO_RUN for a rejection); any other, `_NOT_ENDED`. Raises
    ConflictingEvent for an event the job contradicts: folded in, it rewrote a finished job's configuration
    (so its measured run was credited to another configuration) or merged two clusters' jobs."""
    ts = stamp(event.ts)
    payload = event.payload
    kind = event.type
    if row["cluster_id"] != event.cluster_id:
        raise ConflictingEvent(
            f"job {row['job_id']!r} is a job of cluster {row['cluster_id']!r}, not {event.cluster_id!r}: a "
            "job id names one job across clusters"
        )
    if kind == "job.submitted":
        submitted = _payload_fields(payload)
        _refuse_another_configuration(row, submitted)
        job_fold.fold_submitted(row, ts, submitted)
    elif kind == "job.started":
        job_fold.fold_started(row, ts, payload.node_ids)  # type: ignore[union-attr]
    elif kind == "job.progress":
        job_fold.fold_progress(
            row, ts, payload.tokens_processed, payload.tokens_per_second,  # type: ignore[union-attr]
            payload.gpu_memory_peak_pct, payload.power_watts,  # type: ignore[union-attr]
        )  # fmt: skip
    elif kind in job_fold.TERMINAL_EVENTS:
        fields = _payload_fields(payload)
        if not job_fold.fold_terminal(row, kind, ts, event.event_id, job_fold.outcome_values(kind, fields)):
            return _NOT_ENDED
        if kind == "job.completed":
            return {"job_id": row["job_id"], "is_valid": 1, "observed_at": ts, **fields}
        if kind == "job.failed":
            return {"job_id": row["job_id"], "is_valid": 0, "observed_at": ts, **_NOTHING_MEASURED}
        return _NO_RUN
    return _NOT_ENDED


def _refuse_another_configuration(row: dict[str, Any], submitted: dict[str, Any]) -> None:
    """A job's configuration does not change once submitted: a field it holds may only be sent again as is
    (a later submission may fill in what is still missing, or leave out what it holds)."""
    changed = [
        name for name, value in submitted.items()
        if value is not None and row[name] is not None and not _same_value(row[name], value)
    ]  # fmt: skip
    if changed:
        said = ", ".join(f"{name} {row[name]!r} -> {submitted[name]!r}" for name in changed[:5])
        raise ConflictingEvent(
            f"job {row['job_id']!r} was submitted before with another configuration ({said}): a job's "
            "configuration does not change once submitted; send the new one under a job id of its own"
        )


def _same_value(stored: Any, sent: Any) -> bool:
    """A stored value and a payload's, alike as the store holds them (an enum is its text, 4 is 4.0)."""
    if isinstance(stored, bool) or isinstance(sent, bool):
        return bool(stored) == bool(sent)
    if isinstance(stored, int | float) and isinstance(sent, int | float):
        return float(stored) == float(sent)
    return str(stored) == str(sent)


# --- nodes ------------------------------------------------------------------------------------------------


def _apply_node_events(connection: Connection, events: Sequence[AnyEvent]) -> None:
    """Keep the reports that change a node's state (`ingest.node_changes`), and upsert each node's latest
    status; `updated_at` is the status's own time, so an older report that arrives late does not overwrite
    a newer one. Of two reports of the same time, the larger (status, GPUs, model) stands, whichever came
    first, as the rebuilt state keeps it (twin.rebuild). A stored status dated after the database's clock
    (stored before ingest refused such times, or from a clock running ahead within the allowed skew)
    outranks nothing: any report replaces it, else it would pin the node's state until that time came.
    `last_report_at`, the node's latest report time of all, only ever moves later (a row replaced under
    that rule holds an older report than it)."""
    reports = [_report(event) for event in events]
    # Judged against the nodes' rows as they were before these reports: first.
    node_changes.record_changes(connection, reports)
    latest: dict[str, node_changes.Report] = {}  # of each node's reports, the one that stands
    for report in reports:
        before = latest.get(report.node.node_id)
        if before is None or report.node.key >= before.node.key:
            latest[report.node.node_id] = report
    updated = ("cluster_id", "gpu_model", "gpu_count", "status", "updated_at")
    in_the_future = NODES.c.updated_at > _soon(connection)
    _insert_dicts(
        connection, NODES, [_node_row(latest[node_id]) for node_id in sorted(latest)],
        lambda insert: insert.on_conflict_do_update(
            index_elements=["node_id"],
            set_={name: insert.excluded[name] for name in updated} | {"last_report_at": _later(
                connection, NODES.c.last_report_at, insert.excluded.last_report_at
            )},
            where=(_node_key_sql(NODES.c) <= _node_key_sql(insert.excluded)) | in_the_future,
        ),
        "upsert-newer",
    )  # fmt: skip


def _later(connection: Connection, stored: Any, new: Any) -> Any:
    """The later of a stored time (or None) and a new one, in SQL."""
    later = func.max if connection.dialect.name == "sqlite" else func.greatest  # SQLite's max(a, b) is scalar
    return later(func.coalesce(stored, new), new)


def _report(event: AnyEvent) -> node_changes.Report:
    """The report in UTC, as SQLite stores times (PostgreSQL takes any offset)."""
    payload = event.payload
    node = NodeReport(
        payload.node_id, as_utc(event.ts), payload.status, payload.gpu_count,  # type: ignore[union-attr]
        payload.gpu_model,  # type: ignore[union-attr]
    )  # fmt: skip
    return node_changes.Report(str(event.event_id), event.cluster_id, node)


def _node_row(report: node_changes.Report) -> dict[str, Any]:
    node = report.node
    return {
        "node_id": node.node_id, "cluster_id": report.cluster_id, "gpu_model": node.gpu_model,
        "gpu_count": node.gpu_count, "status": node.status, "updated_at": node.ts, "last_report_at": node.ts,
    }  # fmt: skip


def _node_key_sql(columns: Any) -> Any:  # twin.gpus_up.NodeReport.key, in SQL
    return sqlalchemy.tuple_(columns.updated_at, columns.status, columns.gpu_count, columns.gpu_model)


def _soon(connection: Connection) -> Any:
    """The database's clock a minute ahead, as SQL: a node status dated later than this is in the future.
    (The minute absorbs SQLite's clock, which has whole seconds, and small differences between clocks.)"""
    if connection.dialect.name == "sqlite":  # the text form SQLAlchemy stores times in, in UTC
        return func.strftime("%Y-%m-%d %H:%M:%f", "now", "+1 minute")
    return func.now() + sqlalchemy.text("interval '1 minute'")


def _as_given(ts: datetime) -> datetime:
    return ts


def _utc(ts: datetime) -> datetime:
    """Aware and in UTC; SQLite hands back naive datetimes, which are UTC because only UTC is written."""
    if ts.tzinfo is None:
        return ts.replace(tzinfo=UTC)
    return ts if ts.utcoffset() == _ZERO else ts.astimezone(UTC)  # most events are UTC already: keep them
