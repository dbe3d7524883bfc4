"""Liveness and Prometheus metrics."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Engine, text
from sqlmodel import Session, func, select

from advisor.deps import get_engine, get_settings
from advisor.records import Recommendation
from advisor.routers.cluster import jobs_by_state
from advisor.settings import AdvisorSettings
from calibrate.drift import summarize
from calibrate.registry import ModelRegistry, RegistryError
from twin.clock import cluster_clock, twin_clock
from twin.domain import canonical_gpu_name
from twin.forecast_store import STANDING, latest_forecast
from twin.job_health import attention_counts, attention_grace
from twin.retention import kept_from
from twin.skill import skill
from twin.store import Node, TelemetryEvent

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness and database reachability")
def healthz(engine: Engine = Depends(get_engine)) -> dict[str, str]:
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    return {"status": "ok", "database": engine.dialect.name}


# Gauges of the whole store (every cluster's events) and of the model registry (shared by every cluster).
_NOT_A_CLUSTERS = frozenset({"finetwin_events_applied", "finetwin_model_live_error"})


class _StoreCollector:
    """Store-derived gauges, computed when scraped (they are true whichever process wrote the store)."""

    def __init__(
        self, engine: Engine, cluster_id: str = "default", settings: AdvisorSettings | None = None
    ) -> None:
        self.engine = engine
        self.cluster_id = cluster_id
        self.settings = settings

    def collect(self):  # type: ignore[no-untyped-def]
        """Each gauge of the cluster the API serves labelled `cluster` (its FINETWIN_CLUSTER_ID): with an API
        per cluster, Prometheus keeps their series apart by what they are of, not by which address served
        them, and a dashboard can pick a cluster. The store's and the registry's own gauges have none."""
        for family in self._families():
            if family.name not in _NOT_A_CLUSTERS:
                family.samples = [
                    s._replace(labels={"cluster": self.cluster_id, **s.labels}) for s in family.samples
                ]
            yield family

    def _families(self):  # type: ignore[no-untyped-def]
        # The jobs and nodes of the cluster the API serves (FINETWIN_CLUSTER_ID), as the forecasts' gauges
        # are: a store may hold several. The events are ingest's gauge, which applies every cluster's.
        jobs = GaugeMetricFamily(
            "finetwin_jobs", "The cluster's jobs in the store by state", labels=["state"]
        )
        nodes = GaugeMetricFamily(
            "finetwin_nodes", "The cluster's nodes by GPU model and status", labels=["gpu_model", "status"]
        )
        events = GaugeMetricFamily(
            "finetwin_events_applied",
            "Telemetry events the store holds, of every cluster (applied, and not pruned since)",
        )
        kept = GaugeMetricFamily(
            "finetwin_telemetry_kept_from_seconds",
            "Unix time from which the store keeps the cluster's telemetry (FINETWIN_KEEP_TELEMETRY_DAYS); "
            "0 while nothing was pruned",
        )
        with Session(self.engine) as session:
            for state, count in jobs_by_state(session, self.cluster_id).items():
                jobs.add_metric([state], count)
            query = (
                select(Node.gpu_model, Node.status, func.count())
                .where(Node.cluster_id == self.cluster_id)
                .group_by(Node.gpu_model, Node.status)
            )
            # By GPU type, as the forecast's per-type figures are labelled, whatever each node called it.
            by_type: Counter[tuple[str, str]] = Counter()
            for gpu, status, count in session.exec(query):
                by_type[canonical_gpu_name(gpu), status] += count
            for (gpu, status), count in sorted(by_type.items()):
                nodes.add_metric([gpu, status], count)
            events.add_metric([], session.exec(select(func.count()).select_from(TelemetryEvent)).one())
        horizon = kept_from(self.engine, self.cluster_id)
        kept.add_metric([], horizon.timestamp() if horizon is not None else 0.0)
        yield jobs
        yield nodes
        yield events
        yield kept
        yield from self._skill()
        yield self._attention()
        yield self._recommendations()
        yield from self._live_error()

    def _attention(self) -> GaugeMetricFamily:
        """Running jobs that need attention, by kind, on the twin's clock (as GET /v1/cluster counts them)."""
        gauge = GaugeMetricFamily(
            "finetwin_jobs_needing_attention",
            "Running jobs past their time limit (overdue) or silent past their last progress (stalled)",
            labels=["kind"],
        )
        if self.settings is not None:
            now = cluster_clock(self.engine, self.settings).now
            with Session(self.engine) as session:
                counts = attention_counts(session, self.cluster_id, now, attention_grace(self.settings))
            for kind, count in counts.items():  # each kind, at 0 too: an alert compares a present series
                gauge.add_metric([kind], count)
        return gauge

    def _recommendations(self) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(
            "finetwin_recommendations",
            "The cluster's recommendations by state (pending, approved, ...)",
            labels=["state"],
        )
        query = (
            select(Recommendation.state, func.count())
            .where(Recommendation.cluster_id == self.cluster_id)
            .group_by(Recommendation.state)
        )
        with Session(self.engine) as session:
            for state, count in session.exec(query):
                gauge.add_metric([state], count)
        return gauge

    def _live_error(self):  # type: ignore[no-untyped-def]
        """The rolling live error of the model version in use (as GET /v1/models/live-error's `current`)."""
        gauge = GaugeMetricFamily(
            "finetwin_model_live_error",
            "Rolling live error of the model in use: throughput MdAPE, band coverage, outcome error",
            labels=["model_version", "figure"],
        )
        if self.settings is not None:
            try:
                in_use = ModelRegistry(self.settings.resolved_models_dir()).in_use()
            except RegistryError:
                in_use = None
            if in_use is not None:
                with self.engine.connect() as connection:
                    summary = summarize(connection, in_use, self.settings.drift_window)
                for figure in ("mdape", "band_coverage", "failure_error"):
                    value = getattr(summary, figure)
                    if value is not None:
                        gauge.add_metric([in_use, figure], float(value))
        yield gauge

    def _slo_skill(self, slos: dict[str, dict[str, Any]]):  # type: ignore[no-untyped-def]
        """Each SLO's forecasts, as probabilities of its holding, against whether it held."""
        gauges = {
            key: GaugeMetricFamily(f"finetwin_forecast_slo_{key}", text, labels=["slo"])
            for key, text in (
                (
                    "brier",
                    "Brier score of the forecasts' chance that the SLO holds, per interval (0 is perfect)",
                ),
                (
                    "brier_skill",
                    "1 - Brier(twin) / Brier(persistence) over the same intervals; above 0: better",
                ),
                ("forecast_share", "Mean chance forecast that the SLO holds in an interval"),
                ("held_share", "Share of the scored intervals in which the SLO held"),
            )
        }
        for name, stats in slos.items():
            for key, gauge in gauges.items():
                if stats[key] is not None:
                    gauge.add_metric([name], float(stats[key]))
        yield from gauges.values()

    def _skill(self):  # type: ignore[no-untyped-def]
        """The forecast skill of GET /v1/forecast/skill (all scored intervals) and the standing forecast's
        age on the twin's clock."""
        found = skill(self.engine, self.cluster_id)
        figures = found["figures"]
        gauges = {
            key: GaugeMetricFamily(f"finetwin_forecast_{key}", text, labels=["figure"])
            for key, text in (
                ("mape", "Mean absolute percentage error of the stored forecasts' means, per figure"),
                # MAPE runs into the thousands for nearly idle figures; the weighted error stays readable.
                ("wape", "Summed absolute error of the forecasts' means over the summed actuals, per figure"),
                ("coverage", "Share of scored intervals whose actual lay inside the forecast's p10-p90"),
                ("raw_coverage", "The same for the ensemble's own band, before its conformal recalibration"),
                ("scored_intervals", "Scored forecast intervals, per figure"),
                ("persistence_mae", "MAE of persistence (the interval before the forecast, again)"),
                ("skill_score", "1 - MAE(twin) / MAE(persistence) over the same intervals; above 0: better"),
            )
        }
        sources = (("mape", "mape"), ("wape", "wape"), ("coverage", "coverage"),
                   ("raw_coverage", "raw_coverage"), ("scored_intervals", "n"),
                   ("persistence_mae", "persistence_mae"), ("skill_score", "skill_score"))  # fmt: skip
        for figure, stats in figures.items():
            for key, source in sources:
                if stats[source] is not None:
                    gauges[key].add_metric([figure], float(stats[source]))
        yield from gauges.values()
        yield from self._slo_skill(found["slos"])
        age = GaugeMetricFamily(
            "finetwin_forecast_age_seconds", "Telemetry time since the standing forecast's start"
        )
        latest = latest_forecast(self.engine, cluster_id=self.cluster_id, kind=STANDING)
        if latest is not None and latest.start is not None:
            clock = twin_clock(self.engine, self.cluster_id)
            start = latest.start if latest.start.tzinfo else latest.start.replace(tzinfo=clock.now.tzinfo)
            age.add_metric([], (clock.now - start).total_seconds())
        yield age


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(
    engine: Engine = Depends(get_engine), settings: AdvisorSettings = Depends(get_settings)
) -> Response:
    registry = CollectorRegistry()
    registry.register(_StoreCollector(engine, settings.cluster_id, settings))
    body = generate_latest(registry) + generate_latest(REGISTRY)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
