"""Recommendations: the queue a person works through (approve / reject), and cluster steering runs.

Approving needs the approver role (checked before the recommendation is looked up); the approval and the
outbox message for `finetwin.actions` commit together, and the outbox relay (started here when a Kafka
bootstrap is configured) publishes it.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, func, select

from advisor import workflow
from advisor.auth import Principal, Role, access, require_role
from advisor.deps import get_engine, get_settings
from advisor.outbox import OutboxRelay, RelayThread
from advisor.records import OutboxMessage, Recommendation
from advisor.timestamps import UtcDatetime
from twin.db import session_scope
from twin.settings import Settings

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/recommendations", tags=["recommendations"])

RecommendationState = Literal["pending", "approved", "rejected", "expired", "superseded"]
RecommendationId = Path(min_length=1, max_length=36, description="the recommendation's id (a UUID)")


class RecommendationOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
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


def _out(session: Session, rec: Recommendation) -> RecommendationOut:
    out = RecommendationOut.model_validate(rec)
    if rec.state == workflow.State.APPROVED.value:
        query = select(OutboxMessage.sent_at).where(OutboxMessage.key == rec.id)
        sent = session.exec(query.order_by(col(OutboxMessage.created_at))).first()
        out.published = sent is not None
    return out


@router.get("", response_model=RecommendationPage, summary="Recommendations, pending first, best first")
def list_recommendations(
    request: Request,
    state: RecommendationState | None = Query(default=None),
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=1_000_000_000),
) -> RecommendationPage:
    engine = request.app.state.engine
    with session_scope(engine) as session:
        workflow.expire_due(session)  # a reader never sees a pending one past its TTL
    with Session(engine) as session:
        query = select(Recommendation)
        count = select(func.count()).select_from(Recommendation)
        if state is not None:
            query = query.where(Recommendation.state == state)
            count = count.where(Recommendation.state == state)
        pending_first = (col(Recommendation.state) != workflow.State.PENDING.value).asc()
        query = query.order_by(
            pending_first, col(Recommendation.score).desc(), col(Recommendation.created_at).desc()
        )
        rows = list(session.exec(query.offset(offset).limit(limit)))
        return RecommendationPage(
            total=session.exec(count).one(),
            limit=limit,
            offset=offset,
            recommendations=[_out(session, r) for r in rows],
        )


@router.get(
    "/{recommendation_id}",
    response_model=RecommendationOut,
    summary="One recommendation",
    responses={404: {"description": "no such recommendation"}},
)
def get_recommendation(request: Request, recommendation_id: str = RecommendationId) -> RecommendationOut:
    with Session(request.app.state.engine) as session:
        rec = session.get(Recommendation, recommendation_id)
        if rec is None:
            raise HTTPException(status_code=404, detail=f"no recommendation {recommendation_id!r}")
        return _out(session, rec)


_DECISION_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "no valid API key"},
    403: {"description": "the key is not an approver"},
    404: {"description": "no such recommendation"},
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
    request: Request,
    recommendation_id: str = RecommendationId,
    body: ApproveIn | None = None,
    principal: Principal = Depends(require_role(Role.APPROVER)),
    settings: Settings = Depends(get_settings),
) -> RecommendationOut:
    engine = request.app.state.engine
    try:
        with session_scope(engine) as session:
            workflow.expire_due(session)
        with session_scope(engine) as session:
            rec = workflow.approve(
                session,
                recommendation_id,
                actor=principal.actor,
                comment=body.comment if body else None,
                actions_topic=settings.actions_topic,
            )
            out = _out(session, rec)
    except workflow.TransitionError as exc:
        raise HTTPException(status_code=exc.status, detail=exc.message) from exc
    relay: RelayThread | None = getattr(request.app.state, "relay", None)
    if relay is not None:
        relay.wake()
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
    request: Request,
    recommendation_id: str = RecommendationId,
    principal: Principal = Depends(require_role(Role.APPROVER)),
) -> RecommendationOut:
    engine = request.app.state.engine
    try:
        with session_scope(engine) as session:
            workflow.expire_due(session)
        with session_scope(engine) as session:
            rec = workflow.reject(session, recommendation_id, actor=principal.actor, comment=body.comment)
            out = _out(session, rec)
    except workflow.TransitionError as exc:
        raise HTTPException(status_code=exc.status, detail=exc.message) from exc
    return out


@router.post(
    "/run",
    response_model=RunOut,
    summary="Run cluster steering now: what-ifs against the SLOs, recording those that help (operator)",
    responses={409: {"description": "steering cannot run yet (no SLOs, no node up, no usable models)"}},
)
def run_now(request: Request, principal: Principal = Depends(require_role(Role.OPERATOR))) -> RunOut:
    from advisor.steering import SteeringUnavailable, run_steering

    try:
        result = run_steering(request.app, actor=principal.actor, source="on-demand")
    except SteeringUnavailable as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from exc
    with Session(get_engine(request)) as session:
        recs = [_out(session, r) for r in result.recommendations]
    return RunOut(evaluated=result.evaluated, recommended=len(recs), recommendations=recs, notes=result.notes)


# --- lifespan: the outbox relay and the scheduled steering ---------------------------------------------


def startup(app: FastAPI) -> None:
    settings: Settings = app.state.settings
    app.state.relay = None
    if settings.kafka_bootstrap:
        relay = OutboxRelay(app.state.engine, settings.kafka_bootstrap)
        app.state.relay = RelayThread(relay, poll_s=settings.relay_poll_seconds).start()
        app.state.relay.wake()  # publish whatever an earlier process left unsent
    scheduler = app.state.scheduler
    scheduler.add_job(
        _expire_job,
        "interval",
        minutes=5,
        args=[app],
        id="recommendations-expire",
        max_instances=1,
        coalesce=True,
    )
    scheduler.add_job(
        _steering_job,
        "interval",
        minutes=settings.steering_interval_minutes,
        args=[app],
        id="recommendations-steering",
        max_instances=1,
        coalesce=True,
    )


def shutdown(app: FastAPI) -> None:
    relay: RelayThread | None = getattr(app.state, "relay", None)
    if relay is not None:
        relay.stop()
        app.state.relay = None


def _expire_job(app: FastAPI) -> None:
    with session_scope(app.state.engine) as session:
        expired = workflow.expire_due(session)
    if expired:
        log.info("expired %d recommendations", len(expired))


def _steering_job(app: FastAPI) -> None:
    from advisor.steering import SteeringUnavailable, run_steering

    try:
        result = run_steering(app, actor="system", source="schedule")
    except SteeringUnavailable as exc:
        log.info("scheduled steering skipped: %s", exc)
        return
    log.info("steering: %d evaluated, %d recommended", result.evaluated, len(result.recommendations))


def ttl(settings: Settings) -> timedelta:
    return timedelta(hours=settings.recommendation_ttl_hours)
