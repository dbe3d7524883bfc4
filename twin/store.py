"""The SQL store's tables (SQLModel). The schema itself is created and upgraded by the Alembic
migrations in `finetwin/migrations`; these classes are how the code reads and writes it.

Measured columns carry the benchmark's own names so an observed run is a benchmark row.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index, Select, String, Text, text
from sqlalchemy.dialects import postgresql
from sqlmodel import Field, Session, SQLModel, select


def utcnow() -> datetime:
    return datetime.now(UTC)


def timestamp_field(*, nullable: bool, **field: Any) -> Any:
    """A timezone-aware timestamp column, for every package's tables (`field`: more of SQLModel's Field)."""
    return Field(sa_column=Column(DateTime(timezone=True), nullable=nullable), **field)


# A UUID in its text form; PostgreSQL stores it natively (16 bytes, compared as such: a cheaper key to index).
EVENT_ID_TYPE = String(36).with_variant(postgresql.UUID(as_uuid=False), "postgresql")
NODE_STATUS = "node.status"
# The condition of the partial index of the nodes' reports, which `twin.rebuild`'s query repeats to use it.
NODE_STATUS_ONLY = text(f"type = '{NODE_STATUS}'")


class TelemetryEvent(SQLModel, table=True):
    """Every event ever applied, once: `event_id` is the primary key, which is what makes redelivery harmless.

    Ingest's insert pays for every index on every event, so there are two: the key, and (cluster, event
    time), which the twin's clock reads (the newest event time) and a backtest reads its window by. A third,
    partial, holds only the nodes' status reports, through which ingest finds the report after one that
    arrived late (`ingest.node_changes`); no other event pays for it.
    """

    __tablename__ = "telemetry_events"
    __table_args__ = (
        Index("ix_telemetry_events_cluster_ts", "cluster_id", "ts"),
        Index("ix_telemetry_events_node_status", "cluster_id", "ts", sqlite_where=NODE_STATUS_ONLY,
              postgresql_where=NODE_STATUS_ONLY),
    )  # fmt: skip

    event_id: str = Field(sa_column=Column(EVENT_ID_TYPE, primary_key=True))
    type: str = Field(max_length=32)
    ts: datetime = timestamp_field(nullable=False)
    cluster_id: str = Field(max_length=200)
    job_id: str | None = Field(default=None, max_length=200)
    payload: dict = Field(sa_column=Column(JSON, nullable=False))
    received_at: datetime = timestamp_field(nullable=False)


# Job states and how far along each is; a late event never moves a job backwards.
JOB_STATE_RANK = {"unknown": 0, "submitted": 1, "running": 2, "rejected": 3, "completed": 3, "failed": 3}
TERMINAL_STATES = frozenset({"rejected", "completed", "failed"})


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    # The list's order, newest first, with a state filter or without (GET /v1/jobs); counts by state, of
    # the API's cluster (the cluster after the state: migration 0017 says why) or of all; the jobs not ended,
    # or ended in a window (`twin.actuals`).
    __table_args__ = (
        Index("ix_jobs_submitted_at", "submitted_at"),
        Index("ix_jobs_state_cluster_submitted_at", "state", "cluster_id", "submitted_at"),
        Index("ix_jobs_ended_at", "ended_at"),
    )

    job_id: str = Field(primary_key=True, max_length=200)
    cluster_id: str = Field(default="default", max_length=200)
    state: str = Field(default="unknown", max_length=16)
    outcome: str | None = Field(default=None, max_length=16)  # valid | rejected | runtime, once ended
    # Configuration (from job.submitted; None until it arrives, which can be after the job ended).
    model_name: str | None = Field(default=None, max_length=200)
    method: str | None = Field(default=None, max_length=16)
    gpu_model: str | None = Field(default=None, max_length=100)
    number_gpus: int | None = None
    number_nodes: int | None = None
    batch_size: int | None = None
    tokens_per_sample: int | None = None
    enable_roce: bool | None = None
    fast_moe: int | None = None
    fast_kernels: bool | None = None
    time_limit_s: float | None = None
    tenant: str | None = Field(default=None, max_length=200)
    dataset_tokens: float | None = None
    experiment_id: str | None = Field(default=None, sa_column=Column(Text))
    identifier: str | None = Field(default=None, sa_column=Column(Text))
    fms_hf_tuning_version: str | None = Field(default=None, max_length=50)
    torch_dtype: str | None = Field(default=None, max_length=50)
    # Life cycle.
    submitted_at: datetime | None = timestamp_field(nullable=True)
    started_at: datetime | None = timestamp_field(nullable=True)
    ended_at: datetime | None = timestamp_field(nullable=True)
    # The terminal event that ended the job (of two at the same time, the one that ends it: twin.job_fold).
    ended_by: str | None = Field(default=None, max_length=36)
    node_ids: list[str] | None = Field(default=None, sa_column=Column(JSON))
    rule: str | None = Field(default=None, max_length=64)
    failure_reason: str | None = Field(default=None, max_length=16)
    failed_after_s: float | None = None
    tokens_processed: float | None = None
    last_tokens_per_second: float | None = None
    last_gpu_memory_peak_pct: float | None = None
    last_power_watts: float | None = None
    progress_at: datetime | None = timestamp_field(nullable=True)  # the time of the progress above
    updated_at: datetime = timestamp_field(nullable=False)


# A job's row as a plain record: the `jobs` table's columns and defaults, as attributes. Reads and folds that
# build thousands of jobs use it: SQLModel's `Job` routes every attribute it sets through SQLAlchemy's
# instrumentation and pydantic (about 280 us to build one; most of folding a week of events), and every
# attribute it returns through a descriptor.
JobRecord: Any = make_dataclass(
    "JobRecord",
    [
        (name, info.annotation, field(default=None if info.is_required() else info.default))
        for name, info in Job.model_fields.items()
    ],
    slots=True,
)
# The jobs' columns in the record's order: `job_records(session, JOB_ROWS.where(...))` reads jobs as records
# (a forecast reads thousands, and ORM objects cost it half of its read of the store).
JOB_ROWS: Select = select(*(getattr(Job, name) for name in Job.model_fields))


def job_records(session: Session, query: Select) -> list[JobRecord]:
    return [JobRecord(*row) for row in session.connection().execute(query)]  # Core rows: no ORM loading


class ObservedRun(SQLModel, table=True):
    """What a finished job measured: the measured columns of a benchmark row (config lives on `jobs`)."""

    __tablename__ = "observed_runs"

    job_id: str = Field(primary_key=True, foreign_key="jobs.job_id", max_length=200)
    is_valid: int
    observed_at: datetime = timestamp_field(nullable=False)
    train_runtime: float | None = None
    dataset_tokens_per_second: float | None = None
    train_tokens_per_second: float | None = None
    train_samples_per_second: float | None = None
    train_steps_per_second: float | None = None
    model_load_time: float | None = None
    gpu_memory_utilization_avg: float | None = None
    gpu_memory_utilization_min: float | None = None
    gpu_memory_utilization_max: float | None = None
    gpu_memory_utilization_peak: float | None = None
    gpu_compute_utilization_avg: float | None = None
    gpu_compute_utilization_min: float | None = None
    gpu_compute_utilization_max: float | None = None
    cpu_compute_utilization: float | None = None
    cpu_memory_utilization: float | None = None
    gpu_power_watts_avg: float | None = None
    gpu_power_watts_min: float | None = None
    gpu_power_watts_max: float | None = None
    gpu_power_percent_avg: float | None = None
    gpu_power_percent_max: float | None = None


class Node(SQLModel, table=True):
    __tablename__ = "nodes"

    node_id: str = Field(primary_key=True, max_length=200)
    cluster_id: str = Field(default="default", max_length=200)
    gpu_model: str = Field(max_length=100)
    gpu_count: int
    status: str = Field(max_length=8)  # up | down | drain
    updated_at: datetime = timestamp_field(nullable=False)
    # The time of the node's latest report of all: `updated_at` is its latest report's unless a report dated
    # in the future was stored (then any report replaces the row). Ingest reads it to tell a report that
    # comes after all the others from one that arrived late (`ingest.node_changes`). None: not known (a row
    # written without telemetry).
    last_report_at: datetime | None = timestamp_field(nullable=True, default=None)


class NodeStatusChange(SQLModel, table=True):
    """The nodes' reports that change something: every `node.status` report except those whose status,
    GPUs and model are the previous report's (by time, then the store's order of two reports of one time).
    What the GPUs up over time read (`twin.gpus_up`): a node reporting every minute is up or down a few
    times a day, so a window reads a few rows per node, not one per minute.

    Kept by ingest in the transaction that stores the report. It may hold more than the changes (a report
    that arrived late, and the one after it, are kept whatever they say), never fewer: each report left out
    says what the kept one before it says, so folding these rows gives what folding every report gives.
    """

    __tablename__ = "node_status_changes"
    __table_args__ = (Index("ix_node_status_changes_cluster_ts", "cluster_id", "ts"),)

    event_id: str = Field(sa_column=Column(EVENT_ID_TYPE, primary_key=True))  # the report's
    cluster_id: str = Field(max_length=200)
    node_id: str = Field(max_length=200)
    ts: datetime = timestamp_field(nullable=False)
    status: str = Field(max_length=8)
    gpu_count: int
    gpu_model: str = Field(max_length=100)


class TelemetryRetention(SQLModel, table=True):
    """How far back a cluster's telemetry is whole (`twin.retention`): dated before `kept_from`, the events
    of the jobs that ended by then, the nodes' reports but each node's latest, and the forecasts' scores of
    the days before it were deleted. One row per cluster that was pruned; none: nothing was."""

    __tablename__ = "telemetry_retention"

    cluster_id: str = Field(primary_key=True, max_length=200)
    kept_from: datetime = timestamp_field(nullable=False)
    pruned_at: datetime = timestamp_field(nullable=False)  # wall time of the latest prune
