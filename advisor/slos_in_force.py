"""The SLOs in force: the newest set declared through `PUT /v1/slos` (kept as versions in the store),
else the YAML file `settings.slo_file`, else the built-in defaults (`twin.slo_attainment.DEFAULT_SLOS`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from advisor import audit_log
from advisor.records import SloDocument
from advisor.settings import AdvisorSettings
from twin.db import session_scope
from twin.slo_attainment import STORED, SloSet, load_slos
from twin.store import utcnow


@dataclass(frozen=True)
class SlosInForce:
    slos: SloSet
    source: str  # api | file | default
    updated_at: datetime | None
    updated_by: str | None


def current_slos(engine: Engine, settings: AdvisorSettings) -> SlosInForce:
    """Raises `twin.slo_attainment.SloFormatError` when no set was declared through the API and the file
    is bad."""
    with Session(engine) as session:
        row = session.exec(select(SloDocument).order_by(col(SloDocument.id).desc()).limit(1)).first()
    if row is not None:
        stored = SloSet.model_validate(row.document, context={STORED: True})
        return SlosInForce(stored, "api", row.created_at, row.created_by)
    if settings.slo_file is not None:
        return SlosInForce(load_slos(settings.slo_file), "file", None, None)
    return SlosInForce(load_slos(None), "default", None, None)


def declare_slos(engine: Engine, slos: SloSet, *, actor: str) -> SlosInForce:
    now = utcnow()
    with session_scope(engine) as session:
        session.add(SloDocument(created_at=now, created_by=actor, document=slos.model_dump(mode="json")))
        names = ", ".join(s.name for s in slos.slos) or "none"
        audit_log.record(
            session, actor=actor, subject="slos", from_state=None, to_state="declared", reason=names
        )
    return SlosInForce(slos, "api", now, actor)
