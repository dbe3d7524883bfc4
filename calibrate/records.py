"""The store's calibration tables: model versions with their metrics, the prediction each job got when it was
submitted, and the live error once it ended. Created by migration 0002; these classes read and write them.

The model registry on disk is the truth about versions (artifacts, pointer, history); `model_versions` is
the store's record of them, so the dashboard and the live error can name a version without the files.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Column, Index, Text
from sqlmodel import Field, SQLModel

from twin.store import timestamp_field


class ModelVersionRecord(SQLModel, table=True):
    __tablename__ = "model_versions"

    version: str = Field(primary_key=True, max_length=64)
    created_at: datetime = timestamp_field(nullable=False)
    recorded_at: datetime = timestamp_field(nullable=False)
    data_fingerprint: str = Field(max_length=64)
    n_rows: int
    rows_by_source: dict = Field(sa_column=Column(JSON, nullable=False))
    metrics: dict = Field(sa_column=Column(JSON, nullable=False))  # held-out metrics of the fit
    promoted: bool = False  # whether it was put in use when it was fitted
    reason: str | None = Field(default=None, sa_column=Column(Text))  # why it was fitted (schedule, drift..)


class JobPrediction(SQLModel, table=True):
    """What the model in use predicted for a job at `job.submitted` (one row per job, never updated)."""

    __tablename__ = "job_predictions"
    __table_args__ = (Index("ix_job_predictions_model_version", "model_version"),)

    job_id: str = Field(primary_key=True, max_length=200)
    model_version: str = Field(max_length=64)
    predicted_at: datetime = timestamp_field(nullable=False)
    outcome: str = Field(max_length=16)  # valid | rejected | runtime
    rule: str | None = Field(default=None, max_length=64)
    p_valid: float
    tokens_per_second_p10: float | None = None
    tokens_per_second_p50: float | None = None
    tokens_per_second_p90: float | None = None
    note: str | None = Field(default=None, sa_column=Column(Text))


class LiveError(SQLModel, table=True):
    """How wrong the stored prediction was once the job ended (one row per job, appended in end order)."""

    __tablename__ = "live_errors"
    __table_args__ = (
        Index("ix_live_errors_model_version_id", "model_version", "id"),
        Index("ix_live_errors_ended_at", "ended_at"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(max_length=200, unique=True, nullable=False)
    model_version: str = Field(max_length=64)
    ended_at: datetime = timestamp_field(nullable=False)
    predicted_outcome: str = Field(max_length=16)
    actual_outcome: str = Field(max_length=16)
    outcome_error: int  # 1 when the predicted outcome was not what happened
    p_valid: float
    failure_brier: float  # (p_valid - ran)^2
    measured_tokens_per_second: float | None = None  # completed jobs only
    predicted_tokens_per_second: float | None = None  # the p50
    ape: float | None = None  # |p50 - measured| / measured
    in_band: bool | None = None  # measured within p10..p90
