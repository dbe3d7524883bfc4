"""The API shows the cluster it serves (FINETWIN_CLUSTER_ID). One ingest can store the telemetry of several
clusters (each event says its `cluster_id`), and each cluster's API forecast its own; but its current view
(GET /v1/cluster, GET /v1/jobs, the jobs that need attention, /metrics) counted every cluster's nodes and
jobs, beside a forecast of one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from finetwin.settings import Settings
from ingest.apply import apply_events
from ingest.events import Event, JobStarted, JobSubmitted, NodeStatus, new_event
from tests.conftest import api_app, api_headers
from twin.domain import canonical_gpu_name

# Each cluster: its GPU type, nodes, running jobs, queued jobs.
CLUSTERS = {"lab-a": ("A100-SXM", 2, 2, 1), "lab-b": ("L40S", 3, 3, 4)}
OTHER_CLUSTER = {"lab-a": "lab-b", "lab-b": "lab-a"}
CONFIG: dict[str, Any] = {
    "model_name": "llama3-8b", "method": "lora", "number_gpus": 8, "number_nodes": 1, "batch_size": 16,
    "tokens_per_sample": 2048,
}  # fmt: skip


def cluster_events(
    cluster_id: str, gpu: str, nodes: int, running: int, queued: int, now: datetime
) -> list[Event]:
    """`nodes` nodes up, `running` jobs on them (the first past its time limit: overdue), `queued` more:
    nodes + 1 + 2 x running + queued events."""

    def event(kind: str, payload: Any, ts: datetime, job_id: str | None = None) -> Event:
        return new_event(kind, payload, job_id=job_id, ts=ts, cluster_id=cluster_id)

    def node_up(k: int, ts: datetime) -> Event:
        return event("node.status", NodeStatus(node_id=f"{cluster_id}-n{k}", gpu_model=gpu, gpu_count=8,
                                                status="up"), ts)  # fmt: skip

    events = [node_up(k, now - timedelta(hours=6)) for k in range(nodes)]
    for k in range(running + queued):
        job_id, limit = f"{cluster_id}-j{k}", {"time_limit_s": 600.0} if k == 0 else {}
        submitted = JobSubmitted(gpu_model=gpu, **CONFIG, **limit)
        events.append(event("job.submitted", submitted, now - timedelta(hours=5), job_id))
        if k < running:
            started = JobStarted(node_ids=[f"{cluster_id}-n{k % nodes}"])
            events.append(event("job.started", started, now - timedelta(hours=4), job_id))
    return [*events, node_up(0, now)]  # the telemetry's newest time: now


def test_each_clusters_api_shows_its_own_nodes_jobs_and_counts(engine: Engine, tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    for cluster_id, (gpu, nodes, running, queued) in CLUSTERS.items():
        apply_events(engine, cluster_events(cluster_id, gpu, nodes, running, queued, now))
    events = sum(nodes + 1 + 2 * running + queued for _, nodes, running, queued in CLUSTERS.values())
    headers = api_headers(engine, "viewer")
    seen = {}
    for cluster_id in CLUSTERS:
        settings = Settings(
            data_dir=tmp_path / cluster_id, models_dir=tmp_path / "models", scheduler_enabled=False,
            cluster_id=cluster_id,
        )  # fmt: skip
        with TestClient(api_app(settings, engine), headers=headers) as client:
            seen[cluster_id] = {
                "cluster": client.get("/v1/cluster").json(),
                "jobs": client.get("/v1/jobs").json(),
                "overdue": client.get("/v1/jobs", params={"attention": "any"}).json(),
                "own job": client.get(f"/v1/jobs/{cluster_id}-j0"),
                "other's job": client.get(f"/v1/jobs/{OTHER_CLUSTER[cluster_id]}-j0"),
                "metrics": {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for family in text_string_to_metric_families(client.get("/metrics").text)
                    for s in family.samples
                },
            }

    for cluster_id, (gpu, nodes, running, queued) in CLUSTERS.items():
        shown, pool = seen[cluster_id], canonical_gpu_name(gpu)
        other_pool = canonical_gpu_name(CLUSTERS[OTHER_CLUSTER[cluster_id]][0])
        cluster = shown["cluster"]
        assert cluster["cluster_id"] == cluster_id
        assert [n["node_id"] for n in cluster["nodes"]] == [f"{cluster_id}-n{k}" for k in range(nodes)]
        assert [(p["gpu_model"], p["nodes_up"], p["gpus_busy"]) for p in cluster["pools"]] == [
            (pool, nodes, 8 * running)
        ]
        assert (cluster["running"], cluster["queued"]) == (running, queued)
        assert cluster["jobs_by_state"] == {"running": running, "submitted": queued}
        assert cluster["attention"]["overdue"] == 1  # its own job past its limit, not the other cluster's
        assert shown["jobs"]["total"] == running + queued
        assert {j["job_id"] for j in shown["jobs"]["jobs"]} == {
            f"{cluster_id}-j{k}" for k in range(running + queued)
        }
        assert [j["job_id"] for j in shown["overdue"]["jobs"]] == [f"{cluster_id}-j0"]
        assert shown["own job"].json()["attention"]["kind"] == "overdue"
        assert shown["other's job"].status_code == 404
        assert (
            shown["other's job"].json()["detail"]
            == f"no job '{OTHER_CLUSTER[cluster_id]}-j0' in cluster '{cluster_id}'"
        )
        metrics, of_it = shown["metrics"], ("cluster", cluster_id)  # each of its gauges says whose it is
        assert metrics["finetwin_jobs", (of_it, ("state", "running"))] == running
        assert metrics["finetwin_jobs", (of_it, ("state", "submitted"))] == queued
        assert metrics["finetwin_nodes", (of_it, ("gpu_model", pool), ("status", "up"))] == nodes
        assert not [key for key in metrics if ("gpu_model", other_pool) in key[1]]
        assert metrics["finetwin_events_applied", ()] == events  # ingest's gauge: both clusters', unlabelled
        assert metrics["finetwin_jobs_needing_attention", (of_it, ("kind", "overdue"))] == 1
        # Every sample of the API's store gauges but the store's and the registry's (ingest's are its own).
        api_gauges = [key for key in metrics if key[0].startswith("finetwin_") and "_ingest_" not in key[0]]
        unlabelled = [(name, labels) for name, labels in api_gauges if of_it not in labels]
        assert unlabelled == [("finetwin_events_applied", ())], unlabelled
