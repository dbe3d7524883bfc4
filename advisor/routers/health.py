"""Liveness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Engine, text
from sqlmodel import Session, func, select

from advisor.deps import get_engine
from twin.store import Job, Node, TelemetryEvent

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness and database reachability")
def healthz(engine: Engine = Depends(get_engine)) -> dict[str, str]:
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    return {"status": "ok", "database": engine.dialect.name}


class _StoreCollector:
    """Store-derived gauges, computed when scraped (they are true whichever process wrote the store)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self):  # type: ignore[no-untyped-def]
        jobs = GaugeMetricFamily("finetwin_jobs", "Jobs in the store by state", labels=["state"])
        nodes = GaugeMetricFamily(
            "finetwin_nodes", "Nodes by GPU model and status", labels=["gpu_model", "status"]
        )
        events = GaugeMetricFamily("finetwin_events_applied", "Telemetry events applied to the store")
        with Session(self.engine) as session:
            for state, count in session.exec(select(Job.state, func.count()).group_by(Job.state)):
                jobs.add_metric([state], count)
            query = select(Node.gpu_model, Node.status, func.count()).group_by(Node.gpu_model, Node.status)
            for gpu, status, count in session.exec(query):
                nodes.add_metric([gpu, status], count)
            events.add_metric([], session.exec(select(func.count()).select_from(TelemetryEvent)).one())
        yield jobs
        yield nodes
        yield events


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(engine: Engine = Depends(get_engine)) -> Response:
    registry = CollectorRegistry()
    registry.register(_StoreCollector(engine))
    body = generate_latest(registry) + generate_latest(REGISTRY)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
