"""The SLOs in force for the cluster (FINETWIN_CLUSTER_ID): the newest set declared for it through
`PUT /v1/slos` (kept as versions in the store), else the YAML file `settings.slo_file`, else the built-in
defaults (`twin.slo_attainment.DEFAULT_SLOS`). Each cluster of a store has its own declared SLOs: one
cluster's operator declaring a set does not change what another cluster's API steers toward."""

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
    """Raises `twin.slo_attainment.SloFormatError` when no set was declared for the cluster through the API
    and the file is bad."""
    query = select(SloDocument).where(SloDocument.cluster_id == settings.cluster_id)
    with Session(engine) as session:
        row = session.exec(query.order_by(col(SloDocument.id).desc()).limit(1)).first()
    if row is not None:
        stored = SloSet.model_validate(row.document, context={STORED: True})
        return SlosInForce(stored, "api", row.created_at, row.created_by)
    if settings.slo_file is not None:
        return SlosInForce(load_slos(settings.slo_file), "file", None, None)
    return SlosInForce(load_slos(None), "default", None, None)


def declare_slos(engine: Engine, slos: SloSet, *, cluster_id: str, actor: str) -> SlosInForce:
    now = utcnow()
    document = slos.model_dump(mode="json")
    with session_scope(engine) as session:
        session.add(SloDocument(cluster_id=cluster_id, created_at=now, created_by=actor, document=document))
        names = ", ".join(s.name for s in slos.slos) or "none"
        audit_log.record(
            session, cluster_id=cluster_id, actor=actor, subject=slos_subject(cluster_id), from_state=None,
            to_state="declared", reason=names,
        )  # fmt: skip
    return SlosInForce(slos, "api", now, actor)


def slos_subject(cluster_id: str) -> str:
    """The audit log's subject for the cluster's SLOs (as `recommendation:<id>` is for a recommendation)."""
    return f"slos:{cluster_id}"
