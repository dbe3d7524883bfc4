"""Live predictions and live error, inside the ingest worker's transaction.

At `job.submitted` the model in use predicts the job and the prediction is stored (`job_predictions`); when
the job ends (`job.completed`, `job.failed` for lack of memory, `job.rejected`) the prediction is compared
with what happened (`live_errors`). After a batch that added live errors, the rolling error of the model in
use is checked and `on_drift` is called when it is past a threshold (the API's refit scheduler listens).

Events are duck-typed on `type`, `job_id`, `ts` and `payload` (`TelemetryEvent`): calibrate does not
import ingest. A job whose `job.submitted` arrives after it ended still gets its live error, from the
store's record of how it ended. Nothing here may stop ingest: a model that cannot be loaded is logged and
the batch goes on without predictions (database errors still roll the batch back, as they must).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Connection, Select, insert, select

from calibrate.config_frame import records_to_frame
from calibrate.drift import DriftPolicy, DriftReport, drift, summarize
from calibrate.records import JobPrediction, LiveError, ModelVersionRecord
from calibrate.registry import InUseModels, RegistryError
from calibrate.settings import CalibrateSettings
from twin.db import in_chunks
from twin.domain import Outcome
from twin.jsonsafe import finite_or_none
from twin.store import Job, ObservedRun, utcnow


class TelemetryEvent(Protocol):
    """What this hook reads of an ingest event (calibrate does not import ingest)."""

    type: str
    job_id: str | None
    ts: datetime
    payload: Any


log = logging.getLogger(__name__)

SUBMITTED = "job.submitted"
ENDED = ("job.completed", "job.failed", "job.rejected")
_MEMORY_FAILURE = "oom"

DriftCallback = Callable[[DriftReport], None]


def prediction_hook(
    settings: CalibrateSettings, *, models_dir: Path | None = None, on_drift: DriftCallback | None = None
) -> LivePredictions:
    """The ingest batch hook: `hook(connection, events)`."""
    return LivePredictions(
        InUseModels(models_dir or settings.resolved_models_dir()),
        DriftPolicy.from_settings(settings),
        on_drift,
    )


class LivePredictions:
    def __init__(
        self, models: InUseModels, policy: DriftPolicy, on_drift: DriftCallback | None = None
    ) -> None:
        self.models = models
        self.policy = policy
        self.on_drift = on_drift
        self._recorded_versions: set[str] = set()

    def __call__(self, connection: Connection, events: Sequence[TelemetryEvent]) -> None:
        submitted = _last_per_job(e for e in events if e.type == SUBMITTED)
        ended = _last_per_job(e for e in events if e.type in ENDED)
        if not submitted and not ended:
            return
        if submitted:
            self._store_predictions(connection, submitted)
        outcomes = self._ended_before_submitted(connection, [j for j in submitted if j not in ended])
        outcomes.update(_outcomes_of(ended))
        added = self._record_errors(connection, outcomes)
        if added and self.on_drift is not None:
            self._check_drift(connection)

    # --- predictions at submission

    def _store_predictions(self, connection: Connection, submitted: dict[str, Any]) -> None:
        try:
            loaded = self.models.get()
        except RegistryError as exc:
            log.error("no live predictions: the model in use cannot be loaded: %s", exc)
            return
        if loaded is None:
            return  # nothing calibrated yet: one small file read per batch, no query
        version, models = loaded
        known = set(_rows_for(connection, JobPrediction.job_id, JobPrediction.job_id, list(submitted)))
        jobs = [job_id for job_id in submitted if job_id not in known]
        if not jobs:
            return
        try:
            predicted = models.predict_frame(records_to_frame(_payload(submitted[job_id]) for job_id in jobs))
        except Exception:  # a model that fails on some input must not stall ingest on this batch forever
            log.exception("no live predictions for %d jobs: the model %s failed on them", len(jobs), version)
            return
        now = utcnow()
        rows = [
            {
                "job_id": job_id,
                "model_version": version,
                "predicted_at": now,
                "outcome": str(p.outcome),
                "rule": p.rule if isinstance(p.rule, str) and p.rule else None,
                "p_valid": float(p.p_valid),
                "tokens_per_second_p10": finite_or_none(p.tokens_per_second_p10),
                "tokens_per_second_p50": finite_or_none(p.tokens_per_second_p50),
                "tokens_per_second_p90": finite_or_none(p.tokens_per_second_p90),
                "note": p.note if isinstance(p.note, str) and p.note else None,
            }
            for job_id, p in zip(jobs, predicted.itertuples(index=False), strict=True)
        ]
        connection.execute(insert(JobPrediction.__table__), rows)  # type: ignore[attr-defined]
        self._record_version(connection, version)

    def _record_version(self, connection: Connection, version: str) -> None:
        """The store learns of every version that made a prediction (a CLI fit has no database)."""
        if version in self._recorded_versions:
            return
        exists = connection.execute(
            select(ModelVersionRecord.version).where(ModelVersionRecord.version == version)
        ).first()
        if exists is None:
            try:
                metadata = self.models.registry.metadata(version)
            except RegistryError as exc:
                log.error("version %s is not recorded in the store: %s", version, exc)
                return
            connection.execute(insert(ModelVersionRecord.__table__), [version_record(metadata)])  # type: ignore[attr-defined]
        self._recorded_versions.add(version)

    # --- live error at the end

    def _ended_before_submitted(self, connection: Connection, job_ids: list[str]) -> dict[str, Ended]:
        """How the jobs just submitted had already ended, from the store (events out of order)."""
        if not job_ids:
            return {}
        query = (
            select(
                Job.job_id, Job.state, Job.failure_reason, Job.ended_at, ObservedRun.dataset_tokens_per_second
            )
            .join(ObservedRun, ObservedRun.job_id == Job.job_id, isouter=True)  # type: ignore[arg-type]
            .where(Job.state.in_(("completed", "failed", "rejected")))  # type: ignore[attr-defined]
        )
        outcomes: dict[str, Ended] = {}
        for row in _rows_for(connection, query, Job.job_id, job_ids):
            actual = _actual(row.state, row.failure_reason)
            if actual is not None:
                outcomes[row.job_id] = Ended(actual, row.dataset_tokens_per_second, row.ended_at or utcnow())
        return outcomes

    def _record_errors(self, connection: Connection, outcomes: dict[str, Ended]) -> int:
        """One live error per job that has a stored prediction and none yet; returns how many were added."""
        if not outcomes:
            return 0
        job_ids = list(outcomes)
        predictions = {
            p.job_id: p for p in _rows_for(connection, select(JobPrediction), JobPrediction.job_id, job_ids)
        }
        done = set(_rows_for(connection, LiveError.job_id, LiveError.job_id, list(predictions)))
        rows = [
            live_error(job_id, predictions[job_id], outcomes[job_id])
            for job_id in job_ids
            if job_id in predictions and job_id not in done
        ]
        if rows:
            connection.execute(insert(LiveError.__table__), rows)  # type: ignore[attr-defined]
        return len(rows)

    def _check_drift(self, connection: Connection) -> None:
        version = self.models.registry.in_use()
        if version is None:
            return
        report = drift(summarize(connection, version, self.policy.window), self.policy)
        if report is not None:
            log.warning("%s", report)
            self.on_drift(report)  # type: ignore[misc]


@dataclass(frozen=True)
class Ended:
    """How a job ended, as far as the models predict it."""

    actual: Outcome
    measured_tokens_per_second: float | None
    ended_at: datetime


def live_error(job_id: str, prediction: Any, ended: Ended) -> dict[str, Any]:
    """A `live_errors` row: the stored prediction against what happened."""
    measured = float(ended.measured_tokens_per_second) if ended.measured_tokens_per_second else None
    p10, p50, p90 = (
        prediction.tokens_per_second_p10, prediction.tokens_per_second_p50, prediction.tokens_per_second_p90
    )  # fmt: skip
    ran = 1.0 if ended.actual == Outcome.VALID else 0.0
    return {
        "job_id": job_id,
        "model_version": prediction.model_version,
        "ended_at": ended.ended_at,
        "predicted_outcome": prediction.outcome,
        "actual_outcome": ended.actual.value,
        "outcome_error": int(prediction.outcome != ended.actual.value),
        "p_valid": prediction.p_valid,
        "failure_brier": (prediction.p_valid - ran) ** 2,
        "measured_tokens_per_second": measured,
        "predicted_tokens_per_second": p50,
        "ape": abs(p50 - measured) / measured if measured and p50 is not None else None,
        "in_band": bool(p10 <= measured <= p90) if measured and p10 is not None and p90 is not None else None,
    }


def _actual(state: str, failure_reason: str | None) -> Outcome | None:
    if state == "completed":
        return Outcome.VALID
    if state == "rejected":
        return Outcome.REJECTED
    if state == "failed" and failure_reason == _MEMORY_FAILURE:
        return Outcome.RUNTIME
    return None  # failed for another reason: not what the failure model predicts


def _outcomes_of(ended: dict[str, Any]) -> dict[str, Ended]:
    outcomes = {}
    for job_id, event in ended.items():
        payload = _payload(event)
        state = {"job.completed": "completed", "job.rejected": "rejected", "job.failed": "failed"}[event.type]
        actual = _actual(state, payload.get("reason"))
        if actual is not None:
            outcomes[job_id] = Ended(actual, payload.get("dataset_tokens_per_second"), event.ts)
    return outcomes


def _rows_for(connection: Connection, query: Any, key: Any, ids: list[str]) -> Iterator[Any]:
    """`query` (a select or a column) restricted to `key IN ids`, in chunks a SQLite statement can take."""
    statement = query if isinstance(query, Select) else select(query)
    for chunk in in_chunks(ids):
        result = connection.execute(statement.where(key.in_(chunk)))
        yield from (result.scalars() if not isinstance(query, Select) else result)


def version_record(metadata: dict[str, Any]) -> dict[str, Any]:
    """A `model_versions` row from a version's metadata."""
    data = metadata.get("data", {})
    created = metadata.get("created_at")
    return {
        "version": metadata["version"],
        "created_at": datetime.fromisoformat(created) if created else utcnow(),
        "recorded_at": utcnow(),
        "data_fingerprint": data.get("fingerprint", ""),
        "n_rows": int(data.get("n_rows", 0)),
        "rows_by_source": data.get("rows_by_source", {}),
        "metrics": metadata.get("heldout_metrics", {}),
        "promoted": bool(metadata.get("promoted", False)),
        "reason": metadata.get("reason"),
    }


def _last_per_job(events: Any) -> dict[str, Any]:
    by_job: dict[str, Any] = {}
    for event in events:
        if event.job_id:
            by_job[event.job_id] = event
    return by_job


def _payload(event: Any) -> dict[str, Any]:
    payload = event.payload
    return payload.model_dump() if hasattr(payload, "model_dump") else dict(payload)
