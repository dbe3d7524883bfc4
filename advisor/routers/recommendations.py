"""Recommendations: the queue a person works through (approve / reject), and cluster steering runs.

Each API lists, shows and decides the recommendations of the cluster it serves (FINETWIN_CLUSTER_ID): another
cluster's, in the same store, is a 404 here. Approving needs the approver role (checked before the
recommendation is looked up); the approval and the
outbox message for `finetwin.actions` commit together, and the outbox relay (one of the API's parts, when
the application gave it a Kafka) publishes it, woken by the approval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine
from sqlmodel import Session, col, func, select

from advisor import workflow
from advisor.auth import Principal, Role, access, require_role
from advisor.deps import get_runtime, get_settings
from advisor.parts import ApiRuntime, ShuttingDown
from advisor.records import OutboxMessage, Recommendation
from advisor.settings import AdvisorSettings
from advisor.single_flight import Outcome
from advisor.steering import (
    SteeringInputs,
    SteeringResult,
    SteeringUnavailable,
    prepare_steering,
    run_steering,
)
from advisor.store_errors import log_failure, public_reason
from advisor.timestamps import UtcDatetime
from twin.clock import cluster_clock
from twin.db import session_scope

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])

RecommendationState = Literal["pending", "approved", "rejected", "expired", "superseded"]
RecommendationId = Path(min_length=1, max_length=36, description="the recommendation's id (a UUID)")


class RecommendationOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    cluster_id: str
    kind: str
    target: str
    title: str
    action: dict[str, Any]
    effect: dict[str, Any]
    cost: float
    score: float
    state: str
    source: str
    created_at: UtcDatetime
    expires_at: UtcDatetime
    decided_at: UtcDatetime | None
    decided_by: str | None
    comment: str | None
    superseded_by: str | None
    published: bool | None = Field(
        default=None, description="approved ones: whether the action is on the actions topic yet"
    )


class RecommendationPage(BaseModel):
    total: int
    limit: int
    offset: int
    recommendations: list[RecommendationOut]


class ApproveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str | None = Field(default=None, max_length=2000)


class RejectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str = Field(min_length=1, max_length=2000, description="why it is rejected (required)")


class RunOut(BaseModel):
    evaluated: int
    recommended: int
    recommendations: list[RecommendationOut]
    notes: list[str]


class SteeringUnderWay(BaseModel):
    started_at: str = Field(description="when it began, wall clock, RFC 3339")
    actor: str = Field(description="who started it (`system`: the schedule)")
    source: str = Field(description="on-demand or schedule")


class RunStarted(BaseModel):
    """A steering run under way, to follow at `poll`: its outcome is the last run's there once
    `under_way` is null."""

    under_way: SteeringUnderWay
    joined: bool = Field(description="true: it was already under way (this request started nothing)")
    poll: str = Field(description="where its outcome will be: GET it until `under_way` is null")


def _out(session: Session, rec: Recommendation) -> RecommendationOut:
    out = RecommendationOut.model_validate(rec)
    if rec.state == workflow.State.APPROVED.value:
        query = select(OutboxMessage.sent_at).where(OutboxMessage.key == rec.id)
        sent = session.exec(query.order_by(col(OutboxMessage.created_at))).first()
        out.published = sent is not None
    return out


@router.get(
    "", response_model=RecommendationPage, summary="The cluster's recommendations, pending first, best first"
)
def list_recommendations(
    runtime: ApiRuntime = Depends(get_runtime),
    state: RecommendationState | None = Query(default=None),
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=1_000_000_000),
) -> RecommendationPage:
    engine = runtime.engine
    with session_scope(engine) as session:
        workflow.expire_due(session)  # a reader never sees a pending one past its TTL
    cluster = col(Recommendation.cluster_id) == runtime.settings.cluster_id
    with Session(engine) as session:
        query = select(Recommendation).where(cluster)
        count = select(func.count()).select_from(Recommendation).where(cluster)
        if state is not None:
            query = query.where(Recommendation.state == state)
            count = count.where(Recommendation.state == state)
        pending_first = (col(Recommendation.state) != workflow.State.PENDING.value).asc()
        # The id last: rows equal in every other key (one steering run's, made at one instant with equal
        # scores) otherwise came in any order, so a row could be on two pages of an offset walk, or on none.
        query = query.order_by(
            pending_first,
            col(Recommendation.score).desc(),
            col(Recommendation.created_at).desc(),
            col(Recommendation.id),
        )
        rows = list(session.exec(query.offset(offset).limit(limit)))
        return RecommendationPage(
            total=session.exec(count).one(),
            limit=limit,
            offset=offset,
            recommendations=[_out(session, r) for r in rows],
        )


@router.get(
    "/steering",
    summary="The last steering run: when (wall and telemetry time), what it evaluated, and why it "
    "recommended nothing when it did not",
)
def last_steering(runtime: ApiRuntime = Depends(get_runtime)) -> dict[str, Any]:
    settings: AdvisorSettings = runtime.settings
    last = runtime.last_steering
    under_way = {"under_way": runtime.steering.under_way()}  # a run now, whose outcome replaces this one
    if last is None:
        return {
            "ran": False,
            "why_none": "steering has not run yet: it runs every "
            f"{settings.steering_interval_minutes:g} min of telemetry time, at most every "
            f"{settings.steering_min_wall_seconds:g} s, once a model is in use and SLOs are declared",
        } | under_way
    return last | under_way


@router.get(
    "/{recommendation_id}",
    response_model=RecommendationOut,
    summary="One recommendation",
    responses={404: {"description": "no such recommendation in the cluster"}},
)
def get_recommendation(
    recommendation_id: str = RecommendationId, runtime: ApiRuntime = Depends(get_runtime)
) -> RecommendationOut:
    cluster_id = runtime.settings.cluster_id
    with Session(runtime.engine) as session:
        rec = workflow.of_cluster(session, cluster_id, recommendation_id)
        if rec is None:
            raise HTTPException(status_code=404, detail=workflow.not_found(cluster_id, recommendation_id))
        return _out(session, rec)


_DECISION_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "no valid API key"},
    403: {"description": "the key is not an approver"},
    404: {"description": "no such recommendation in the cluster"},
    409: {"description": "not pending (already decided, expired or superseded)"},
}


@router.post(
    "/{recommendation_id}/approve",
    response_model=RecommendationOut,
    summary="Approve: the action goes to finetwin.actions (approver role)",
    responses=_DECISION_RESPONSES,
    openapi_extra=access(Role.APPROVER),
)
def approve(
    runtime: ApiRuntime = Depends(get_runtime),
    recommendation_id: str = RecommendationId,
    body: ApproveIn | None = None,
    principal: Principal = Depends(require_role(Role.APPROVER)),
    settings: AdvisorSettings = Depends(get_settings),
) -> RecommendationOut:
    engine = runtime.engine
    try:
        with session_scope(engine) as session:
            workflow.expire_due(session)
        with session_scope(engine) as session:
            rec = workflow.approve(
                session,
                settings.cluster_id,
                recommendation_id,
                actor=principal.actor,
                comment=body.comment if body else None,
                actions_topic=settings.actions_topic,
            )
            out = _out(session, rec)
    except workflow.TransitionError as exc:
        raise HTTPException(status_code=exc.status, detail=exc.message) from exc
    if runtime.relay is not None:
        runtime.relay.wake()
    return out


@router.post(
    "/{recommendation_id}/reject",
    response_model=RecommendationOut,
    summary="Reject, with a comment saying why (approver role)",
    responses=_DECISION_RESPONSES,
    openapi_extra=access(Role.APPROVER),
)
def reject(
    body: RejectIn,
    runtime: ApiRuntime = Depends(get_runtime),
    recommendation_id: str = RecommendationId,
    principal: Principal = Depends(require_role(Role.APPROVER)),
) -> RecommendationOut:
    engine = runtime.engine
    try:
        with session_scope(engine) as session:
            workflow.expire_due(session)
        with session_scope(engine) as session:
            rec = workflow.reject(
                session,
                runtime.settings.cluster_id,
                recommendation_id,
                actor=principal.actor,
                comment=body.comment,
            )
            out = _out(session, rec)
    except workflow.TransitionError as exc:
        raise HTTPException(status_code=exc.status, detail=exc.message) from exc
    return out


STEERING_POLL = "/v1/recommendations/steering"
RESPOND_ASYNC = "respond-async"


def _prefers_async(prefer: str | None) -> bool:
    """Whether the request's `Prefer` header (RFC 7240) asks for `respond-async`."""
    if not prefer:
        return False
    return any(p.split(";")[0].strip().lower() == RESPOND_ASYNC for p in prefer.split(","))


@router.post(
    "/run",
    response_model=RunOut,
    summary="Run cluster steering now: what-ifs against the SLOs, recording those that help (operator)",
    description="Waits for the run (seconds to minutes of both cores) and answers its outcome. With `Prefer: "
    "respond-async` (RFC 7240) it answers 202 at once with the run under way, and its outcome is at "
    f"GET {STEERING_POLL} once `under_way` is null: for clients and proxies that will not wait that long.",
    responses={
        202: {"model": RunStarted, "description": "with `Prefer: respond-async`: the run under way"},
        409: {"description": "steering cannot run yet (no SLOs, no node up, no usable models)"},
        503: {"description": "the API is stopping"},
    },
)
def run_now(
    runtime: ApiRuntime = Depends(get_runtime),
    principal: Principal = Depends(require_role(Role.OPERATOR)),
    prefer: str | None = Header(
        default=None, max_length=200, description="`respond-async`: answer 202 at once, not the outcome"
    ),
) -> Any:
    if _prefers_async(prefer):
        return _start_async(runtime, principal.actor)
    try:
        outcome = _steer(runtime, actor=principal.actor, source="on-demand")
    except SteeringUnavailable as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    except ShuttingDown as exc:
        raise HTTPException(status_code=503, detail=str(exc)) from exc
    result = outcome.value
    notes = list(result.notes)
    if outcome.joined:
        notes.insert(0, "a steering run was already under way: this is its outcome")
    with Session(runtime.engine) as session:
        recs = [_out(session, r) for r in result.recommendations]
    return RunOut(evaluated=result.evaluated, recommended=len(recs), recommendations=recs, notes=notes)


def _start_async(runtime: ApiRuntime, actor: str) -> JSONResponse:
    """A run begun in the background (or the one under way), answered at once."""
    prepared = None
    if runtime.steering.under_way() is None:
        try:  # what stops a run is said now (409), not left for the poller to find
            prepared = prepare_steering(runtime.engine, runtime.settings, runtime.models_in_use)
        except SteeringUnavailable as exc:
            raise HTTPException(status_code=409, detail=str(exc)) from exc
    about, joined = runtime.steering.start(
        _steering(runtime, actor=actor, source="on-demand", prepared=prepared), _about(actor, "on-demand")
    )
    body = RunStarted(under_way=SteeringUnderWay(**about), joined=joined, poll=STEERING_POLL)
    headers = {"Location": STEERING_POLL, "Preference-Applied": RESPOND_ASYNC}
    return JSONResponse(status_code=202, content=body.model_dump(), headers=headers)


# --- the scheduled expiry and steering (put on the scheduler by the lifespan) ------------------------------


def schedule_expiry_and_steering(runtime: ApiRuntime) -> None:
    scheduler = runtime.scheduler
    scheduler.add_job(
        _expire_job, "interval", minutes=5, args=[runtime.engine], id="recommendations-expire",
        max_instances=1, coalesce=True, replace_existing=True,
    )  # fmt: skip
    scheduler.add_job(
        _steering_job, "interval", seconds=STEERING_TICK_S, args=[runtime], id="recommendations-steering",
        max_instances=1, coalesce=True, replace_existing=True,
    )  # fmt: skip


def _expire_job(engine: Engine) -> None:
    with session_scope(engine) as session:
        expired = workflow.expire_due(session)
    if expired:
        log.info("expired %d recommendations", len(expired))


def _about(actor: str, source: str) -> dict[str, Any]:
    return {"started_at": datetime.now(UTC).isoformat(), "actor": actor, "source": source}


def _steering(
    runtime: ApiRuntime, *, actor: str, source: str, prepared: SteeringInputs | None = None,
    telemetry_at: datetime | None = None,
) -> Callable[[], SteeringResult]:  # fmt: skip
    """A steering run that remembers its own outcome for GET /steering, whoever waits for it or not:
    a run begun in the background has nobody else to."""

    def job() -> SteeringResult:
        # The twin's time it starts from, read when it runs (a caller that joins a run under way reads none).
        started = telemetry_at or cluster_clock(runtime.engine, runtime.settings).now
        try:
            result = run_steering(
                runtime.engine, runtime.settings, runtime.models_in_use, actor=actor, source=source,
                progress=runtime.check_stopping, prepared=prepared,
            )  # fmt: skip
        except ShuttingDown:
            log.info("steering abandoned: the API is stopping")
            raise
        except SteeringUnavailable as exc:
            log.info("steering could not run: %s", exc)
            _remember_none(runtime, str(exc))
            raise
        except Exception as exc:
            log_failure(log, "steering failed", exc)
            _remember_none(runtime, f"the last steering run failed: {public_reason(exc)}")
            raise
        _remember(runtime, result, started)
        log.info("steering: %d evaluated, %d recommended", result.evaluated, len(result.recommendations))
        return result

    return job


def _steer(
    runtime: ApiRuntime, *, actor: str, source: str, telemetry_at: datetime | None = None
) -> Outcome[SteeringResult]:
    """A steering run, or the outcome of the one under way (advisor.single_flight)."""
    job = _steering(runtime, actor=actor, source=source, telemetry_at=telemetry_at)
    return runtime.steering.run(job, _about(actor, source))


# The steering job looks this often whether a run is due: soon after the first model is in use, then every
# FINETWIN_STEERING_INTERVAL_MINUTES of telemetry time, at most every FINETWIN_STEERING_MIN_WALL_SECONDS.
STEERING_TICK_S = 30.0


def _steering_job(runtime: ApiRuntime) -> None:
    """Steers when due (see STEERING_TICK_S); a run that could not happen (no model yet) is retried at the
    next tick. The run remembers its own outcome (`_steering`)."""
    settings: AdvisorSettings = runtime.settings
    clock = cluster_clock(runtime.engine, settings)
    last = runtime.last_steering
    if last is not None and last.get("telemetry_at"):
        since = (clock.now - datetime.fromisoformat(last["telemetry_at"])).total_seconds()
        wall = (datetime.now(UTC) - datetime.fromisoformat(last["at"])).total_seconds()
        if since < settings.steering_interval_minutes * 60.0 or wall < settings.steering_min_wall_seconds:
            return
    try:
        _steer(runtime, actor="system", source="schedule", telemetry_at=clock.now)
    except Exception:  # said and remembered by the run; the scheduler must keep running
        return


def _remember(runtime: ApiRuntime, result: SteeringResult, telemetry_at: datetime) -> None:
    """The last run's outcome, for the panel (this process's memory: it is about the latest run only)."""
    runtime.last_steering = {
        "ran": True,
        "at": datetime.now(UTC).isoformat(),
        "telemetry_at": telemetry_at.isoformat(),
        "evaluated": result.evaluated,
        "recommended": len(result.recommendations),
        "why_none": result.why_none,
        "notes": result.notes,
    }


def _remember_none(runtime: ApiRuntime, why: str) -> None:
    """A run that did not happen or did not finish: no telemetry time, so the schedule tries again."""
    runtime.last_steering = {
        "ran": False,
        "at": datetime.now(UTC).isoformat(),
        "telemetry_at": None,
        "why_none": why,
    }


def ttl(settings: AdvisorSettings) -> timedelta:
    return timedelta(hours=settings.recommendation_ttl_hours)
