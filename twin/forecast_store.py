"""Stored forecasts: the standing forecast the API refreshes on a schedule, and forecasts made on demand.

The forecast itself is one JSON document (what `twin.forecast.forecast` returns); a few columns beside it
say which cluster, when, and how it was made, so the latest one is one indexed query away.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, DateTime, Engine, Index
from sqlmodel import Field, Session, SQLModel, col, select

from twin.db import session_scope
from twin.store import utcnow

STANDING = "standing"
ON_DEMAND = "on_demand"


class StoredForecast(SQLModel, table=True):
    __tablename__ = "forecasts"
    __table_args__ = (Index("ix_forecasts_cluster_kind_created", "cluster_id", "kind", "created_at"),)

    id: int | None = Field(default=None, primary_key=True)
    cluster_id: str = Field(max_length=200)
    kind: str = Field(max_length=16)  # standing | on_demand
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    horizon_s: float | None = None
    runs: int
    seed: int = Field(sa_column=Column(BigInteger, nullable=False))
    wall_s: float | None = None
    document: dict = Field(sa_column=Column(JSON, nullable=False))


def save_forecast(
    engine: Engine, document: dict[str, Any], *, cluster_id: str, kind: str = STANDING, keep: int = 100
) -> int:
    """Stores a forecast and keeps only the newest `keep` of its cluster and kind; returns its id."""
    with session_scope(engine) as session:
        row = StoredForecast(
            cluster_id=cluster_id,
            kind=kind,
            created_at=utcnow(),
            horizon_s=document.get("horizon_s"),
            runs=int(document.get("runs", 0)),
            seed=int(document.get("seed", 0)),
            wall_s=document.get("wall_s"),
            document=document,
        )
        session.add(row)
        session.flush()
        new_id = int(row.id)  # type: ignore[arg-type]
        old = session.exec(
            select(StoredForecast.id)
            .where(StoredForecast.cluster_id == cluster_id, StoredForecast.kind == kind)
            .order_by(col(StoredForecast.created_at).desc(), col(StoredForecast.id).desc())
            .offset(keep)
        ).all()
        for stale in old:
            session.delete(session.get(StoredForecast, stale))
    return new_id


def latest_forecast(engine: Engine, *, cluster_id: str, kind: str = STANDING) -> StoredForecast | None:
    with Session(engine, expire_on_commit=False) as session:
        return session.exec(
            select(StoredForecast)
            .where(StoredForecast.cluster_id == cluster_id, StoredForecast.kind == kind)
            .order_by(col(StoredForecast.created_at).desc(), col(StoredForecast.id).desc())
            .limit(1)
        ).first()
