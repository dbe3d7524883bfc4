"""How a job's telemetry makes its row: one set of rules for the store (`ingest.apply`, as events arrive) and
for the state rebuilt from the stored events (`twin.rebuild`, in event-time order).

Each rule picks by the events' own times, and on a tie by their values, never by which event arrived
first: what the store holds of a job is a function of the events it was sent, so the live twin (which reads
the store) and a backtest (which rebuilds the past) see the same cluster however late, repeated or
contradictory the telemetry was. Real telemetry is all three: an agent reports a job failed and the
scheduler that it completed; a stale agent reports progress after the job ended.

- the configuration is every field any `job.submitted` gave (a field it holds is never changed: the store
  refuses a submission that contradicts it), and the submission time the earliest;
- the start is the earliest `job.started`, with its nodes (on a tie, the larger list);
- the progress is the furthest report (most tokens; then the latest; then the larger rate, memory, power)
  among those dated no later than the job's end;
- the earliest terminal event ends the job, with its outcome; on a tie in time the more pessimistic
  (rejected, then failed, then completed), then the larger event id;
- the state never moves back: unknown, submitted, running, then the end.

Rows are dicts with the `jobs` table's columns. Times on them may be naive (SQLite's, which are UTC).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from twin.clock import as_utc
from twin.store import JOB_STATE_RANK, TERMINAL_STATES

TERMINAL_EVENTS = {"job.rejected": "rejected", "job.failed": "failed", "job.completed": "completed"}
_OUTCOMES = {"rejected": "rejected", "failed": "runtime", "completed": "valid"}
_TIE_RANK = {"rejected": 0, "failed": 1, "completed": 2}  # at the same instant, the more pessimistic ends it
_LONG_AGO = datetime.min.replace(tzinfo=UTC)  # the time of progress stored before its time was kept
_PROGRESS = ("tokens_processed", "last_tokens_per_second", "last_gpu_memory_peak_pct", "last_power_watts")


def advance(row: dict[str, Any], state: str) -> None:
    """Move the job to `state` unless it is already as far along (a terminal state is final)."""
    current = row["state"] or "unknown"
    if current not in TERMINAL_STATES and JOB_STATE_RANK[state] > JOB_STATE_RANK.get(current, 0):
        row["state"] = state


def fold_submitted(row: dict[str, Any], ts: datetime, fields: Mapping[str, Any]) -> None:
    """The configuration's fields the row does not hold yet (a name that is not a column is left out: a
    stored payload of an older contract); the earliest submission time."""
    if row["model_name"] is None and fields.keys() <= row.keys():
        row.update(fields)  # the first submission: every configuration column is empty until it comes
    else:
        for name, value in fields.items():
            if value is not None and row.get(name, value) is None:
                row[name] = value
    if row["submitted_at"] is None or ts < as_utc(row["submitted_at"]):
        row["submitted_at"] = ts
    advance(row, "submitted")


def fold_started(row: dict[str, Any], ts: datetime, node_ids: Sequence[str]) -> None:
    started = row["started_at"]
    nodes = list(node_ids)
    if started is None or ts < as_utc(started) or (ts == as_utc(started) and nodes > (row["node_ids"] or [])):
        row["started_at"], row["node_ids"] = ts, nodes
    advance(row, "running")


def fold_progress(
    row: dict[str, Any], ts: datetime, tokens: float, rate: float, memory: float | None, power: float | None
) -> None:
    """A progress report dated after the job ended is not its progress (a stale agent's, or a clock's
    error: it rewrote a finished job's last power, and so the energy of its last interval)."""
    if row["state"] in TERMINAL_STATES and row["ended_at"] is not None and ts > as_utc(row["ended_at"]):
        return
    if row["tokens_processed"] is not None:
        stored = _progress_key(
            row["tokens_processed"], _stored_progress_at(row), row["last_tokens_per_second"],
            row["last_gpu_memory_peak_pct"], row["last_power_watts"],
        )  # fmt: skip
        if _progress_key(tokens, ts, rate, memory, power) <= stored:
            return
    row.update(
        tokens_processed=tokens, last_tokens_per_second=rate, last_gpu_memory_peak_pct=memory,
        last_power_watts=power, progress_at=ts,
    )  # fmt: skip


def _stored_progress_at(row: dict[str, Any]) -> datetime:
    return _LONG_AGO if row["progress_at"] is None else as_utc(row["progress_at"])


def _progress_key(
    tokens: float, ts: datetime, rate: float | None, memory: float | None, power: float | None
) -> tuple[float, datetime, float, float, float]:
    return (tokens, ts, -1.0 if rate is None else rate, -1.0 if memory is None else memory,
            -1.0 if power is None else power)  # fmt: skip


def fold_terminal(
    row: dict[str, Any], kind: str, ts: datetime, event_id: uuid.UUID | str, values: Mapping[str, Any]
) -> bool:
    """Whether this terminal event (`kind` one of TERMINAL_EVENTS) ends the job: the first to, or one dated
    before the one that had. `values` are the outcome's columns: `rule` for a rejection, `failure_reason`
    and `failed_after_s` for a failure."""
    state = TERMINAL_EVENTS[kind]
    if row["state"] in TERMINAL_STATES and row["ended_at"] is not None:
        ended_at = as_utc(row["ended_at"])
        if ts > ended_at:
            return False
        if ts == ended_at:
            ours, theirs = _TIE_RANK[state], _TIE_RANK[row["state"]]
            if ours > theirs or (ours == theirs and _id_value(event_id) >= _id_value(row["ended_by"])):
                return False
    row.update(state=state, outcome=_OUTCOMES[state], ended_at=ts, ended_by=str(event_id), rule=None,
               failure_reason=None, failed_after_s=None)  # fmt: skip
    row.update(values)
    return True


def _id_value(event_id: uuid.UUID | str | None) -> int:
    """An event id's 128-bit value (0 for none: a job ended before the store kept which event ended it)."""
    if event_id is None:
        return 0
    return event_id.int if isinstance(event_id, uuid.UUID) else uuid.UUID(event_id).int


def outcome_values(kind: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The outcome's columns a terminal event sets (`fold_terminal`'s `values`), from its payload's fields."""
    if kind == "job.rejected":
        return {"rule": str(payload["rule"])}
    if kind == "job.failed":
        return {"failure_reason": payload["reason"], "failed_after_s": payload["seconds_into_run"]}
    return {}


def progress_after_end(row: dict[str, Any]) -> bool:
    """Whether the row's progress is dated after the job's end: it came before an earlier end did, and the
    job's progress must be folded again from its reports dated by the end."""
    at = row["progress_at"]
    return at is not None and row["ended_at"] is not None and as_utc(at) > as_utc(row["ended_at"])


def forget_progress(row: dict[str, Any]) -> None:
    row.update(dict.fromkeys(_PROGRESS), progress_at=None)
