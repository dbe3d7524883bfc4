"""Jobs as the store knows them from telemetry."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, func, select

from advisor.deps import get_session, get_settings
from advisor.settings import AdvisorSettings
from advisor.timestamps import UtcDatetime
from twin.clock import cluster_clock
from twin.domain import UnknownGpuModel, canonical_gpu_name, gpu_key, known_gpu_name
from twin.job_config import PartialJobConfig
from twin.job_health import Attention, attention_grace, needing_attention
from twin.job_health import attention as job_attention
from twin.store import Job, Node

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobState = Literal["unknown", "submitted", "running", "rejected", "completed", "failed"]


class AttentionOut(BaseModel):
    """Why a running job needs attention, on the twin's clock (`twin.job_health`)."""

    kind: Literal["overdue", "stalled"] = Field(
        description="overdue: past its time limit, its end not reported; stalled: no progress reported"
    )
    since: UtcDatetime = Field(description="when it became so")
    why: str


class JobOut(PartialJobConfig):  # type: ignore[misc,valid-type]
    """A job as the store knows it: its configuration (None until its `job.submitted` arrives) and life."""

    model_config = ConfigDict(from_attributes=True, protected_namespaces=())

    job_id: str
    cluster_id: str
    state: str
    outcome: str | None
    tenant: str | None
    dataset_tokens: float | None
    submitted_at: UtcDatetime | None
    started_at: UtcDatetime | None
    ended_at: UtcDatetime | None
    node_ids: list[str] | None
    rule: str | None
    failure_reason: str | None
    failed_after_s: float | None
    tokens_processed: float | None
    last_tokens_per_second: float | None
    progress_at: UtcDatetime | None = Field(description="the time of the latest progress report")
    attention: AttentionOut | None = Field(
        default=None, description="a running job that needs a person: overdue or stalled (null: it does not)"
    )


class JobPage(BaseModel):
    total: int
    limit: int
    offset: int
    jobs: list[JobOut]


def gpu_spellings(session: Session, gpu_model: str, table: type[Job] | type[Node] = Job) -> list[str]:
    """The names the store's jobs (or nodes) give the GPU type `gpu_model` names, in any spelling (a name the
    catalogue lacks, as the cluster reported it, in any case and with spaces or hyphens)."""
    wanted = gpu_key(canonical_gpu_name(gpu_model))
    stored = session.exec(select(table.gpu_model).distinct()).all()
    return [name for name in stored if name is not None and gpu_key(canonical_gpu_name(name)) == wanted]


def _known_gpu_or_422(session: Session, gpu_model: str) -> None:
    """A name no stored job or node has and the catalogue does not know is a mistake (`A100` for one of its
    types), not a GPU type without jobs: 422 with the names meant, where an empty page would say there are
    none. A type the cluster's nodes report (telemetry takes one the catalogue lacks) has no jobs yet."""
    if gpu_spellings(session, gpu_model, Node):
        return
    try:
        known_gpu_name(gpu_model)
    except UnknownGpuModel as error:
        problem = {"type": "value_error", "loc": ("query", "gpu_model"), "input": gpu_model}
        raise RequestValidationError([{**problem, "msg": str(error)}]) from None


@router.get("", response_model=JobPage, summary="List jobs, newest first")
def list_jobs(
    state: JobState | None = Query(default=None, description="only jobs in this state"),
    gpu_model: str | None = Query(
        default=None, max_length=100, description="only jobs on this GPU type, in any spelling (A100-SXM)"
    ),
    attention: Literal["any", "overdue", "stalled"] | None = Query(
        default=None,
        description="only running jobs that need attention (of this kind), on the twin's clock: past their "
        "time limit, or silent past their last progress report, by FINETWIN_JOB_ATTENTION_MINUTES",
    ),
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=1_000_000_000),
    session: Session = Depends(get_session),
    settings: AdvisorSettings = Depends(get_settings),
) -> JobPage:
    if attention is not None:
        return _needing_attention(session, settings, attention, state, gpu_model, limit, offset)
    # The cluster the API serves: a store may hold the jobs of several (FINETWIN_CLUSTER_ID).
    query = select(Job).where(Job.cluster_id == settings.cluster_id)
    count = select(func.count()).select_from(Job).where(Job.cluster_id == settings.cluster_id)
    if state is not None:
        query = query.where(Job.state == state)
        count = count.where(Job.state == state)
    if gpu_model is not None:
        # The store holds each GPU name as its cluster reported it (`NVIDIA A100-SXM4-80GB`, `A100-SXM`):
        # the filter takes every spelling of the one GPU type, as every other input takes any of them.
        spellings = gpu_spellings(session, gpu_model)
        if not spellings:
            _known_gpu_or_422(session, gpu_model)
        query = query.where(col(Job.gpu_model).in_(spellings))
        count = count.where(col(Job.gpu_model).in_(spellings))
    query = query.order_by(col(Job.submitted_at).desc(), col(Job.job_id)).offset(offset).limit(limit)
    jobs = _with_attention(session, settings, list(session.exec(query)))
    return JobPage(total=session.exec(count).one(), limit=limit, offset=offset, jobs=jobs)


def _attention_out(said: Attention) -> AttentionOut:
    return AttentionOut.model_validate(said, from_attributes=True)


def _now(session: Session, settings: AdvisorSettings) -> datetime:
    """The twin's now: telemetry time when it and the wall clock disagree (a replay, a stalled feed)."""
    return cluster_clock(session.get_bind(), settings).now  # type: ignore[arg-type]


def _with_attention(session: Session, settings: AdvisorSettings, jobs: list[Job]) -> list[JobOut]:
    out = [JobOut.model_validate(j) for j in jobs]
    if any(j.state == "running" for j in jobs):  # the clock only when a job may need it
        now, grace = _now(session, settings), attention_grace(settings)
        for job, shown in zip(jobs, out, strict=True):
            said = job_attention(job, now, grace)
            shown.attention = None if said is None else _attention_out(said)
    return out


def _needing_attention(
    session: Session, settings: AdvisorSettings, kind: str, state: str | None, gpu_model: str | None,
    limit: int, offset: int,
) -> JobPage:  # fmt: skip
    """The running jobs that need attention (of `kind`, or `any`), with the list's other filters."""
    spellings = None if gpu_model is None else gpu_spellings(session, gpu_model)
    if gpu_model is not None and not spellings:
        _known_gpu_or_422(session, gpu_model)
    found = needing_attention(
        session, settings.cluster_id, _now(session, settings), attention_grace(settings)
    )
    keep = [
        (job, said) for job, said in found
        if kind in ("any", said.kind) and state in (None, "running")
        and (spellings is None or job.gpu_model in spellings)
    ]  # fmt: skip
    jobs = [
        JobOut.model_validate(job).model_copy(update={"attention": _attention_out(said)})
        for job, said in keep[offset : offset + limit]
    ]
    return JobPage(total=len(keep), limit=limit, offset=offset, jobs=jobs)


# `:path`: telemetry takes a job id with a slash (`team/run-7`); as one path segment, `jobs/team%2Frun-7`
# arrived decoded as two and was a 404.
@router.get(
    "/{job_id:path}",
    response_model=JobOut,
    summary="One job",
    responses={404: {"description": "no such job"}},
)
def get_job(
    job_id: str = Path(min_length=1, max_length=200),
    session: Session = Depends(get_session),
    settings: AdvisorSettings = Depends(get_settings),
) -> JobOut:
    job = session.get(Job, job_id)
    if job is None or job.cluster_id != settings.cluster_id:  # another cluster's is not this API's to show
        raise HTTPException(status_code=404, detail=f"no job {job_id!r} in cluster {settings.cluster_id!r}")
    return _with_attention(session, settings, [job])[0]
