"""Capacity plans over HTTP: a sweep of cluster shapes and policies against the SLOs, as a background job.

`POST /v1/plan` (operator) checks the request and the live state at once (a bad range is a 422, no cluster
a 409), then queues the sweep and answers 202 with the job's id; `GET /v1/plan/{id}` gives its progress and,
once done, the result (the same document as `finetwin plan --json`). `POST /v1/plan/{id}/recommend` turns
the sweep's cheapest scenario into a pending recommendation that an approver approves like any other; asked
again (a retry, a second click, six at once) while that recommendation is pending, it answers the same one.

Sweeps run one at a time on a worker thread of the API process that was asked, at most MAX_QUEUED_PLANS
waiting behind it (a 429 beyond); each fans out on the local process pool, or on Ray when
FINETWIN_RAY_ADDRESS is set. Plans are kept in the store (`advisor.plan_jobs`): any API process of it answers
about any plan, after a restart too. A plan running when the API stops ends after its tasks in flight, failed
with "stopped: ...", rather than holding the API up for the rest of its sweep.
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, Field, StrictFloat, StrictInt

from advisor import workflow
from advisor.auth import Principal, Role, access, require_role
from advisor.deps import get_runtime
from advisor.parts import ApiRuntime, ShuttingDown
from advisor.plan_jobs import MAX_KEPT, MAX_QUEUED_PLANS, PLAN_QUEUE_FULL, PlanJob, PlanJobs, PlanOut
from advisor.routers.forecast import (
    MAX_WHATIF_JOB_RUNS,
    _job_models,
    _live,
    _slos,
    cluster_and_series_problems,
)
from advisor.settings import AdvisorSettings
from advisor.store_errors import log_failure, public_reason
from twin.capacity import (
    SweepError,
    SweepRequest,
    SweepSize,
    enumerate_scenarios,
    make_tasks,
    run_sweep,
    sweep_size,
)
from twin.cluster import ClusterFormatError, cluster_from_spec
from twin.db import session_scope
from twin.executors import make_executor
from twin.whatif import Duration

log = logging.getLogger("finetwin.plan")
router = APIRouter(prefix="/v1/plan", tags=["capacity plan"])

MAX_API_RUNS = 64
# A plan runs in the background, so it may take minutes, not hours: the twin simulates ~15k jobs/s on one
# core, so this many is ~3 minutes on two. Each scenario's cluster and series, and each task's work, are
# bounded as a what-if's. Without these, one request (a horizon of 1e308 s, or 100,000 nodes of a type) held
# every core and grew by GBs a minute, and the API could not stop until its workers were killed.
MAX_PLAN_JOB_RUNS = 5_000_000
NO_STATE = 409
CAPACITY_TARGET = "capacity"  # every capacity plan acts on the cluster's shape: a newer one supersedes


def size_problems(size: SweepSize) -> list[str]:
    """What makes a plan too big to run over HTTP (nothing: it may run)."""
    problems = cluster_and_series_problems(size.nodes, size.gpus, size.intervals, "a scenario of ")
    if size.job_runs > MAX_PLAN_JOB_RUNS:
        problems.append(
            f"{size.job_runs:,} simulated jobs: {size.scenarios} scenarios x {size.runs} runs x "
            f"{size.jobs_per_run:,} jobs (at most {MAX_PLAN_JOB_RUNS:,}; narrower ranges, fewer runs or a "
            "shorter horizon)"
        )
    # A task as long as a what-if at most: an API asked to stop stops after the tasks in flight.
    if size.task_job_runs > MAX_WHATIF_JOB_RUNS:
        problems.append(
            f"{size.task_job_runs:,} simulated jobs in a task: {size.task_runs} runs x "
            f"{size.jobs_per_run:,} jobs (at most {MAX_WHATIF_JOB_RUNS:,}; a smaller chunk_runs or a shorter "
            "horizon)"
        )
    return problems


class PlanBody(SweepRequest):
    """A sweep of the live workload (the store's queue and arrival process). `cluster` replaces the store's
    cluster as the base the ranges change: `{"nodes": [{"gpu_model", "count", "gpus_per_node"}]}`."""

    runs: StrictInt = Field(default=16, ge=1, le=MAX_API_RUNS)
    horizon: Duration | StrictFloat = "24h"  # the live arrival process needs a window
    cluster: dict[str, Any] | None = None


def _run(job: PlanJob, work: Any, runtime: ApiRuntime) -> None:
    jobs: PlanJobs = runtime.plan_jobs
    job.status = "running"
    jobs.save(job)
    # Not closed afterwards: on Ray, the API process keeps one connection for its plans and forecasts.
    executor = make_executor(runtime.settings.ray_address, runtime.settings.forecast_workers)

    def progress(done: int, total: int) -> None:
        job.done, job.total = done, total
        # A plan can take minutes: the API stops after the tasks in flight, not after the whole sweep.
        runtime.check_stopping()

    try:
        job.result = work(executor, progress)
        job.status = "done"
    except ShuttingDown:
        log.info("capacity plan %s stopped after %d of %d tasks: the API is stopping", job.id, job.done,
                 job.total)  # fmt: skip
        job.error = "stopped: the API stopped before the plan finished"
        job.status = "failed"
    except Exception as exc:  # the job reports it; the API goes on
        log_failure(log, f"capacity plan {job.id} failed", exc)
        job.error = public_reason(exc)
        job.status = "failed"
    jobs.save(job)


@router.post(
    "",
    status_code=202,
    response_model=PlanOut,
    summary="Start a capacity plan: the cheapest cluster and policy that meets the SLOs (a background job)",
    responses={
        409: {"description": "nothing to plan yet (no node up) or the models fail verification"},
        PLAN_QUEUE_FULL: {
            "description": f"{MAX_QUEUED_PLANS} plans are queued already; retry after Retry-After seconds"
        },
    },
    openapi_extra=access(Role.OPERATOR),
)
def post_plan(body: PlanBody, runtime: ApiRuntime = Depends(get_runtime)) -> PlanOut:
    inputs = _live(runtime)
    if body.cluster is not None:
        try:
            inputs.cluster = cluster_from_spec(body.cluster, "cluster")
        except ClusterFormatError as exc:
            raise HTTPException(422, str(exc)) from None
    models, _source = _job_models(runtime)
    slos = _slos(runtime)
    sweep = SweepRequest.model_validate(body.model_dump(exclude={"cluster"}))
    try:
        scenarios = enumerate_scenarios(inputs.cluster, sweep)
    except SweepError as exc:
        raise HTTPException(422, str(exc)) from None
    problems = size_problems(sweep_size(inputs, sweep, scenarios))
    if problems:
        raise HTTPException(422, "the plan is too big to run here: " + "; ".join(problems))
    total = len(make_tasks(scenarios, sweep.runs, sweep.chunk_runs))
    job = PlanJob(id=str(uuid.uuid4()), created_at=datetime.now(UTC), total=total)

    def work(executor: Any, progress: Any) -> dict[str, Any]:
        return run_sweep(inputs, models, sweep, slos, executor, progress=progress)

    jobs: PlanJobs = runtime.plan_jobs
    jobs.add(job)
    jobs.pool.submit(_run, job, work, runtime)
    return job.out()


@router.get(
    "",
    response_model=list[PlanOut],
    summary=f"The plans of every API process of the store, newest first (the newest {MAX_KEPT})",
)
def list_plans(runtime: ApiRuntime = Depends(get_runtime)) -> list[PlanOut]:
    return [j.out(with_result=False) for j in runtime.plan_jobs.newest()]


@router.get(
    "/{plan_id}",
    response_model=PlanOut,
    summary="A plan's progress and, once done, its result (scenarios, frontier, cheapest)",
    responses={404: {"description": "no such plan"}},
)
def get_plan(plan_id: str, runtime: ApiRuntime = Depends(get_runtime)) -> PlanOut:
    return runtime.plan_jobs.get(plan_id).out()


class RecommendOut(BaseModel):
    recommendation_id: str
    title: str
    created: bool = Field(
        default=True,
        description="false: this plan's recommendation was pending already, and this is it (nothing new)",
    )


@router.post(
    "/{plan_id}/recommend",
    response_model=RecommendOut,
    summary="Make the plan's cheapest scenario a pending recommendation (an approver decides)",
    responses={
        404: {"description": "no such plan"},
        409: {"description": "the plan is not done, or no scenario meets the SLOs"},
    },
)
def recommend_plan(
    plan_id: str,
    runtime: ApiRuntime = Depends(get_runtime),
    principal: Principal = Depends(require_role(Role.OPERATOR)),
) -> RecommendOut:
    job: PlanJob = runtime.plan_jobs.get(plan_id)
    if job.status != "done" or job.result is None:
        raise HTTPException(NO_STATE, f"plan {plan_id} is {job.status}, not done")
    best = job.result["cheapest"]
    if best is None:
        raise HTTPException(NO_STATE, "no scenario of this plan meets the SLOs: nothing to recommend")
    proposal = _capacity_proposal(plan_id, job.result, best)
    settings: AdvisorSettings = runtime.settings
    with session_scope(runtime.engine) as session:
        # Claimed before the look: requests at once for one plan are answered one after the other, and
        # all but the first find the first one's recommendation.
        workflow.claim_targets(session, settings.cluster_id, [CAPACITY_TARGET])
        pending = workflow.pending_for(session, settings.cluster_id, CAPACITY_TARGET)
        if pending is not None and pending.effect.get("plan_id") == plan_id:
            return RecommendOut(recommendation_id=pending.id, title=pending.title, created=False)
        (rec,) = workflow.propose(
            session,
            [proposal],
            cluster_id=settings.cluster_id,
            actor=principal.actor,
            # The plan's id is in the effect: `source` is at most 32 characters in the store.
            source="capacity plan",
            ttl=timedelta(hours=settings.recommendation_ttl_hours),
        )
        rec_id, title = rec.id, rec.title
    return RecommendOut(recommendation_id=rec_id, title=title)


def _capacity_proposal(plan_id: str, result: dict[str, Any], best: dict[str, Any]) -> workflow.Proposal:
    """The plan's cheapest scenario (`best`) as a recommendation of the cluster's shape."""
    nodes = ", ".join(f"{count} x {gpu}" for gpu, count in best["nodes"].items())
    return workflow.Proposal(
        kind="capacity",
        target=CAPACITY_TARGET,
        title=f"provision {nodes} nodes, schedule {best['policy']}, admission {best['admission']}",
        action={"nodes": best["nodes"], "policy": best["policy"], "admission": best["admission"]},
        effect={
            "metric": "SLOs met in at least the plan's confidence of its runs (capacity plan)",
            "plan_id": plan_id,
            "confidence": result["confidence"],
            "runs": result["runs"],
            "slos": best["slos"],
            "gpu_hours_per_day": best["gpu_hours_per_day"],
            "energy_kwh_per_day": best["energy_kwh_per_day"],
        },
        cost=best["gpu_hours_per_day"],
        score=min((s["met_share"] for s in best["slos"].values()), default=1.0),
    )
