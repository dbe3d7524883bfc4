"""Running jobs that need a person's attention, on the twin's clock (telemetry time):

- **overdue**: running past its time limit (`time_limit_s`) by more than the grace. The scheduler stops a
  job at its limit, so it has ended and its end was never reported (a lost `job.completed`/`job.failed`),
  or the scheduler failed to stop it;
- **stalled**: it has reported progress, but none for longer than the grace. Multi-node training that
  hangs (a collective waiting forever for a peer) holds every GPU it has and reports nothing more.

Telemetry has no rule that calls a job lost (progress reports are optional, a job may run for days), so
nothing is ended or left out here: these are said, to the operator and in the forecast's notes. A job that
never reported progress and has no time limit cannot be told from a long one, and is never flagged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, get_args

from sqlmodel import Session, col, select

from twin.clock import as_utc
from twin.settings import TwinSettings
from twin.store import Job

AttentionKind = Literal["overdue", "stalled"]
ATTENTION_KINDS: tuple[AttentionKind, ...] = get_args(AttentionKind)
# The default grace: three times the longest gap between two progress reports of a replayed run
# (`ingest.replay.PROGRESS_GAP_S`), and far longer than a stopped job takes to report its end.
DEFAULT_GRACE = timedelta(minutes=30)


@dataclass(frozen=True)
class Attention:
    kind: AttentionKind
    since: datetime  # when the job became so: its limit or its last progress, plus the grace
    why: str


def attention(job: Any, now: datetime, grace: timedelta = DEFAULT_GRACE) -> Attention | None:
    """Whether a job (a `Job` row or record: state, started_at, time_limit_s, progress_at) needs attention
    at `now`; None when it does not, or is not running."""
    if job.state != "running":
        return None
    now = as_utc(now)
    if job.started_at is not None and job.time_limit_s is not None and job.time_limit_s > 0:
        limit = as_utc(job.started_at) + timedelta(seconds=float(job.time_limit_s))
        if now > limit + grace:
            allowed = _span(timedelta(seconds=float(job.time_limit_s)))
            return Attention(
                "overdue", limit + grace,
                f"running {_span(now - limit)} past its time limit of {allowed}: its end was not reported, "
                "or it was not stopped",
            )  # fmt: skip
    if job.progress_at is not None:
        silent = now - as_utc(job.progress_at)
        if silent > grace:
            return Attention(
                "stalled", as_utc(job.progress_at) + grace,
                f"no progress reported for {_span(silent)}: it may hang, holding its GPUs",
            )  # fmt: skip
    return None


def _span(span: timedelta) -> str:
    """A duration as a person reads it: 45 min, 3.2 h, 2.5 d."""
    seconds = span.total_seconds()
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def attention_by_job(
    jobs: list[Any], now: datetime, grace: timedelta = DEFAULT_GRACE
) -> dict[str, Attention]:
    """The jobs (rows or records with a `job_id`) that need attention at `now`, by id."""
    found = ((job.job_id, attention(job, now, grace)) for job in jobs)
    return {job_id: said for job_id, said in found if said is not None}


def attention_notes(flagged: dict[str, Attention], grace: timedelta = DEFAULT_GRACE) -> list[str]:
    """The forecast's notes on the running jobs that need attention (`attention_by_job`; none when none
    does)."""
    kinds = [said.kind for said in flagged.values()]
    notes = []
    if overdue := kinds.count("overdue"):
        notes.append(
            f"{overdue} running job(s) past their time limit with no end reported: forecast to end now"
        )
    if stalled := kinds.count("stalled"):
        notes.append(
            f"{stalled} running job(s) have reported no progress for over {_span(grace)}: they may hang; "
            "forecast to hold their GPUs for the rest of their work"
        )
    return notes


def attention_grace(settings: TwinSettings) -> timedelta:
    """How long past its limit or its last progress a running job goes before it needs attention."""
    return timedelta(minutes=settings.job_attention_minutes)


def attention_counts(
    session: Session, cluster_id: str, now: datetime, grace: timedelta = DEFAULT_GRACE
) -> dict[str, int]:
    """The cluster's running jobs that need attention, by kind: every kind, at 0 too (a reader compares
    counts)."""
    counts = Counter(said.kind for _, said in needing_attention(session, cluster_id, now, grace))
    return {kind: counts[kind] for kind in ATTENTION_KINDS}


def needing_attention(
    session: Session, cluster_id: str, now: datetime, grace: timedelta = DEFAULT_GRACE
) -> list[tuple[Job, Attention]]:
    """The cluster's running jobs that need attention at `now` (its clock's), newest submitted first. A
    cluster runs as many jobs as it has GPUs at most, so they are judged here, not in SQL (time arithmetic
    differs by database)."""
    running = session.exec(
        select(Job)
        .where(Job.cluster_id == cluster_id, Job.state == "running")
        .order_by(col(Job.submitted_at).desc(), col(Job.job_id))
    )
    found = ((job, attention(job, now, grace)) for job in running)
    return [(job, said) for job, said in found if said is not None]
