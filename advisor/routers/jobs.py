"""Jobs as the store knows them from telemetry."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict
from sqlmodel import Session, col, func, select

from advisor.deps import get_session
from advisor.timestamps import UtcDatetime
from twin.domain import UnknownGpuModel, canonical_gpu_name, gpu_key, known_gpu_name
from twin.job_config import PartialJobConfig
from twin.store import Job, Node

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobState = Literal["unknown", "submitted", "running", "rejected", "completed", "failed"]


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
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=1_000_000_000),
    session: Session = Depends(get_session),
) -> JobPage:
    query = select(Job)
    count = select(func.count()).select_from(Job)
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
    jobs = [JobOut.model_validate(j) for j in session.exec(query)]
    return JobPage(total=session.exec(count).one(), limit=limit, offset=offset, jobs=jobs)


# `:path`: telemetry takes a job id with a slash (`team/run-7`); as one path segment, `jobs/team%2Frun-7`
# arrived decoded as two and was a 404.
@router.get(
    "/{job_id:path}",
    response_model=JobOut,
    summary="One job",
    responses={404: {"description": "no such job"}},
)
def get_job(
    job_id: str = Path(min_length=1, max_length=200), session: Session = Depends(get_session)
) -> JobOut:
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id!r}")
    return JobOut.model_validate(job)
