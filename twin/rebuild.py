"""The cluster as it stood at a past telemetry time T, rebuilt from the stored raw events.

The `jobs` and `nodes` tables hold the present; a backtest needs the past. Every event the store applied is
kept (`telemetry_events`), so folding the events dated at or before T gives the jobs, nodes, observed work
and failure times of that moment, by the rules ingest applies them with (`twin.job_fold`): a job's
submission and start are its earliest reports, its progress the furthest one dated by its end, its state
never moves back, the earliest terminal event ends it, a node's status is its latest report. Those rules
make a job's row a function of its events, whatever order they were delivered in, so the state rebuilt at
T is the row the store held at T.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from twin import job_fold
from twin.clock import as_utc, window_start
from twin.live_state import StoreRows, newest_failure_times
from twin.store import NODE_STATUS, Job, JobRecord, Node, NodeStatusChange, TelemetryEvent

_EMPTY_JOB: dict[str, Any] = {**dict.fromkeys(Job.model_fields), "state": "unknown"}


@dataclass
class RebuiltState:
    """The store's rows at time `at`, and what telemetry said by then."""

    at: datetime
    jobs: dict[str, JobRecord]
    nodes: list[Node]
    observed_work: dict[str, float]  # job id -> dataset tokens of its completed run
    observed_power_w: dict[str, float]  # job id -> average power per GPU its run measured
    failures: list[float]  # seconds into the run of the runtime failures, newest first

    def rows(self, since: datetime) -> StoreRows:
        active = [j for j in self.jobs.values() if j.state in ("submitted", "running")]
        history = [
            j for j in self.jobs.values() if j.submitted_at is not None and since <= j.submitted_at < self.at
        ]
        return StoreRows(self.nodes, active, history, self.observed_work, list(self.failures))


StoredEvent = tuple[str, str, datetime, str | None, Mapping[str, Any]]  # event id, type, ts, job id, payload


def stored_events(engine: Engine, cluster_id: str, until: datetime) -> list[StoredEvent]:
    """(event id, type, ts, job id, payload) of the cluster's events dated at or before `until`, in
    event-time order."""
    with Session(engine) as session:
        return _read_events(
            session, TelemetryEvent.cluster_id == cluster_id, col(TelemetryEvent.ts) <= as_utc(until)
        )


@dataclass
class BacktestStates:
    """What a backtest at T over [T, end] starts from and is scored against."""

    since: datetime  # the start of the arrivals' window before T
    before: RebuiltState  # at T
    after: RebuiltState  # at `end`


def backtest_states(
    engine: Engine, cluster_id: str, at: datetime, end: datetime, lookback: timedelta
) -> BacktestStates:
    """The states at `at` and `end` of the jobs a backtest reads, from the events of its window only.

    Folding every event up to `end` grows with the record (1.7 GB at 3 million events). A backtest
    needs the jobs queued or running at T, the jobs submitted in [since, end], every node, and the newest
    failure times. Each job's state depends on its own events only, so those jobs are folded from the
    events dated from the window's start (or the oldest job still open at T, if earlier) to `end`, which
    hold all of their events (a job's telemetry starts with its submission or start). The nodes' older
    reports come from their own index, and the failure times from the jobs' end times, as a live forecast
    reads them. Which jobs those are is read off the `jobs` table, whose submission and end times follow
    the fold's rules (earliest submission; the first terminal event ends a job), so it names every job open
    at T (and maybe a few more, which the fold then finds ended).
    """
    at, end = as_utc(at), as_utc(end)
    since = window_start(engine, cluster_id, at - lookback, at)  # as a live forecast at T reads it
    with Session(engine) as session:
        in_cluster = Job.cluster_id == cluster_id
        open_at = session.exec(
            select(Job.job_id, Job.submitted_at, Job.started_at).where(
                in_cluster,
                col(Job.ended_at).is_(None) | (col(Job.ended_at) > at),
                (col(Job.submitted_at) <= at) | (col(Job.started_at) <= at),
            )
        ).all()
        in_window = session.exec(
            select(Job.job_id).where(in_cluster, col(Job.submitted_at) >= since, col(Job.submitted_at) <= end)
        ).all()
        starts = [as_utc(t) for _, *times in open_at for t in times if t is not None]
        read_from = min([since, *starts])
        job_events = _read_events(
            session, TelemetryEvent.cluster_id == cluster_id, TelemetryEvent.type != NODE_STATUS,
            col(TelemetryEvent.ts) >= read_from, col(TelemetryEvent.ts) <= end,
        )  # fmt: skip
        # The nodes' reports, before the window and in it: those that changed something (a node's heartbeats
        # would make this read grow with the record; the states they fold to are the same).
        node_changes = _read_changes(session, cluster_id, end)
        failures = newest_failure_times(session, cluster_id, at)
    wanted = {job_id for job_id, *_ in open_at} | set(in_window)
    kept = node_changes + [e for e in job_events if e[3] in wanted]
    before = replace(fold_events(kept, cluster_id, at), failures=[f for f in failures if f is not None])
    return BacktestStates(since, before, fold_events(kept, cluster_id, end))


def _read_events(session: Session, *conditions: Any) -> list[StoredEvent]:
    rows = session.exec(
        select(
            TelemetryEvent.event_id,
            TelemetryEvent.type,
            TelemetryEvent.ts,
            TelemetryEvent.job_id,
            TelemetryEvent.payload,
        )
        .where(*conditions)
        .order_by(col(TelemetryEvent.ts))
    ).all()
    return [
        (str(event_id), kind, as_utc(ts), job_id, payload) for event_id, kind, ts, job_id, payload in rows
    ]


def _read_changes(session: Session, cluster_id: str, until: datetime) -> list[StoredEvent]:
    """The nodes' reports that changed something (`twin.store.NodeStatusChange`) dated at or before `until`,
    as stored events."""
    rows = session.exec(
        select(NodeStatusChange)
        .where(NodeStatusChange.cluster_id == cluster_id, col(NodeStatusChange.ts) <= until)
        .order_by(col(NodeStatusChange.ts))
    ).all()
    return [
        (str(row.event_id), NODE_STATUS, as_utc(row.ts), None,
         {"node_id": row.node_id, "status": row.status, "gpu_count": row.gpu_count,
          "gpu_model": row.gpu_model})
        for row in rows
    ]  # fmt: skip


def rebuild_at(engine: Engine, cluster_id: str, at: datetime) -> RebuiltState:
    at = as_utc(at)
    return fold_events(stored_events(engine, cluster_id, at), cluster_id, at)


def fold_events(events: Iterable[StoredEvent], cluster_id: str, at: datetime) -> RebuiltState:
    """The state after the events dated at or before `at`, folded in event-time order by the store's rules
    (`twin.job_fold`)."""
    ordered = sorted((e for e in events if e[2] <= at), key=lambda e: e[2])
    jobs: dict[str, dict[str, Any]] = {}
    nodes: dict[str, Node] = {}
    work: dict[str, float] = {}
    power: dict[str, float] = {}
    failed: dict[str, tuple[datetime, float]] = {}
    for event_id, kind, ts, job_id, payload in ordered:
        if kind == NODE_STATUS:
            _fold_node(nodes, cluster_id, ts, payload)
            continue
        if job_id is None:
            continue
        job = jobs.get(job_id)
        if job is None:
            job = jobs[job_id] = {**_EMPTY_JOB, "job_id": job_id, "cluster_id": cluster_id}
        job["updated_at"] = ts
        if kind == "job.submitted":
            job_fold.fold_submitted(job, ts, payload)
        elif kind == "job.started":
            job_fold.fold_started(job, ts, payload.get("node_ids") or [])
        elif kind == "job.progress":
            job_fold.fold_progress(
                job, ts, payload["tokens_processed"], payload["tokens_per_second"],
                payload.get("gpu_memory_peak_pct"), payload.get("power_watts"),
            )  # fmt: skip
        elif kind in job_fold.TERMINAL_EVENTS:
            values = job_fold.outcome_values(kind, payload)
            if not job_fold.fold_terminal(job, kind, ts, event_id, values):
                continue
            for measured in (work, power, failed):
                measured.pop(job_id, None)
            if kind == "job.completed":
                tps, runtime = payload.get("dataset_tokens_per_second"), payload.get("train_runtime")
                if tps and runtime:
                    work[job_id] = float(tps) * float(runtime)
                if payload.get("gpu_power_watts_avg"):
                    power[job_id] = float(payload["gpu_power_watts_avg"])
            elif kind == "job.failed" and values["failed_after_s"] is not None:
                failed[job_id] = (ts, float(values["failed_after_s"]))
    failures = [seconds for _, seconds in sorted(failed.values(), key=lambda f: f[0], reverse=True)]
    records = {job_id: JobRecord(**row) for job_id, row in jobs.items()}
    return RebuiltState(at, records, [nodes[k] for k in sorted(nodes)], work, power, failures)


def _fold_node(nodes: dict[str, Node], cluster_id: str, ts: datetime, payload: Mapping[str, Any]) -> None:
    """A node is its latest report; of two at the same time, the larger (status, GPUs, model), as the store
    keeps it (ingest.apply)."""
    node_id = str(payload["node_id"])
    report = Node(
        node_id=node_id, cluster_id=cluster_id, gpu_model=payload["gpu_model"],
        gpu_count=int(payload["gpu_count"]), status=payload["status"], updated_at=ts,
    )  # fmt: skip
    before = nodes.get(node_id)
    if before is None or _node_key(report) >= _node_key(before):
        nodes[node_id] = report


def _node_key(node: Node) -> tuple[datetime, str, int, str]:
    return (as_utc(node.updated_at), node.status, node.gpu_count, node.gpu_model)
