"""The audit log, newest first: who did what to which recommendation (or SLOs, or keys), when and why: of the
cluster the API serves (FINETWIN_CLUSTER_ID), and the store's keys."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict
from sqlmodel import Session

from advisor import audit_log
from advisor.deps import get_session, get_settings
from advisor.settings import AdvisorSettings
from advisor.timestamps import UtcDatetime

router = APIRouter(prefix="/v1/audit", tags=["audit"])


class AuditEntryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    cluster_id: str | None  # None: the store's (an API key), or recorded before entries said
    ts: UtcDatetime
    actor: str
    subject: str
    from_state: str | None
    to_state: str | None
    reason: str | None


class AuditPage(BaseModel):
    total: int
    limit: int
    offset: int
    entries: list[AuditEntryOut]


@router.get(
    "",
    response_model=AuditPage,
    summary="The append-only audit log of the cluster and the store, newest first",
)
def audit(
    subject: str | None = Query(
        default=None, max_length=200, description="only this subject, e.g. recommendation:<id>"
    ),
    limit: int = Query(default=100, ge=1, le=1000),
    offset: int = Query(default=0, ge=0, le=1_000_000_000),
    session: Session = Depends(get_session),
    settings: AdvisorSettings = Depends(get_settings),
) -> AuditPage:
    total, rows = audit_log.entries(session, settings.cluster_id, subject=subject, limit=limit, offset=offset)
    return AuditPage(
        total=total, limit=limit, offset=offset, entries=[AuditEntryOut.model_validate(r) for r in rows]
    )
