"""The API's reads on a store that has run for months: the requests the dashboard repeats (and a page of
GET /v1/jobs, and a Prometheus scrape) on a large store, against the same requests on a store a hundred
times smaller. A read that does not grow with the record keeps a ratio near 1.

    .venv/bin/python bench/big_store.py [--jobs 500000] [--database-url URL] [--repeat 3]

Each store holds `--jobs` jobs submitted 30 s apart (all but the last 200 ended: a third each completed,
failed at runtime and rejected, as in the benchmark), six telemetry events a job, a live error for each
ended one and an observed run for each completed one, a recommendation every 20 jobs (steering's three every
30 min of telemetry: mostly superseded, some expired, approved or rejected, the last few pending) with its
two audit entries, written directly (the small store: a hundredth of them), and the 100 standing forecasts
a store keeps. Besides the GETs: what each standing forecast reads
of the store (`load_live_inputs`).
Served in process (FastAPI's test client, one viewer key), best of `--repeat`, same machine, one run. The
standing forecast's scores, which grow the fastest, have their own benchmark (`bench/skill.py`).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import Engine, insert  # noqa: E402
from timing import analyze, best_of, print_table, small_and_large  # noqa: E402

from advisor.records import AuditEntry, Recommendation  # noqa: E402
from calibrate.records import LiveError  # noqa: E402
from finetwin.schema import migrate  # noqa: E402
from twin.db import make_engine  # noqa: E402
from twin.forecast_store import save_forecast  # noqa: E402
from twin.live_state import load_live_inputs  # noqa: E402
from twin.store import Job, Node, ObservedRun, TelemetryEvent  # noqa: E402

REQUESTS = (
    "/v1/cluster", "/v1/jobs?state=running&limit=50", "/v1/jobs?state=submitted&limit=50",
    "/v1/jobs?limit=50", "/v1/jobs?state=completed&limit=50&offset=1000", "/v1/models/live-error?limit=200",
    "/v1/audit?limit=50", "/v1/recommendations?limit=50", "/v1/forecast/skill", "/v1/forecast/vs-actual",
    "/metrics",
)  # fmt: skip
FORECAST_READ = "the store's state for a forecast (load_live_inputs)"
GPUS = ("NVIDIA-A100-SXM4-80GB", "L40S", "NVIDIA-H100-PCIe", "NVIDIA-A100-80GB-PCIe")
ENDED = ("completed", "failed", "rejected")  # a third each, as in the benchmark
OUTCOMES = {"completed": "valid", "failed": "runtime", "rejected": "rejected"}  # as ingest sets them
JOBS_PER_RECOMMENDATION = 20
DECIDED = ("superseded",) * 6 + ("expired", "approved", "rejected")  # the states of the older ones
EVENTS = ("job.submitted", "job.started", "job.progress", "job.progress", "job.progress", "job.completed")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def fill(engine: Engine, jobs: int) -> None:
    with engine.begin() as connection:
        connection.execute(insert(Node), [
            {"node_id": f"n{i}", "gpu_model": GPUS[i % 4], "gpu_count": 8, "status": "up", "updated_at": T0}
            for i in range(64)
        ])  # fmt: skip
        for first in range(0, jobs, 20_000):
            job_rows, event_rows, error_rows, run_rows = [], [], [], []
            for i in range(first, min(jobs, first + 20_000)):
                submitted = T0 + timedelta(seconds=30 * i)
                state = ENDED[i % 3] if i < jobs - 200 else "running" if i < jobs - 100 else "submitted"
                job_rows.append({
                    "job_id": f"j{i}", "state": state, "outcome": OUTCOMES.get(state),
                    "model_name": "llama3-8b", "method": "lora",
                    "gpu_model": GPUS[i % 4], "number_gpus": 2, "number_nodes": 1, "batch_size": 8,
                    "tokens_per_sample": 1024, "dataset_tokens": 1e7, "submitted_at": submitted,
                    "started_at": None if state == "submitted" else submitted + timedelta(minutes=1),
                    "ended_at": submitted + timedelta(hours=1) if state in ENDED else None,
                    "failed_after_s": 600.0 + i % 100 if state == "failed" else None, "updated_at": submitted,
                })  # fmt: skip
                event_rows.extend({
                    "event_id": str(uuid.UUID(int=8 * i + k)), "type": kind, "cluster_id": "default",
                    "ts": submitted + timedelta(minutes=10 * k), "job_id": f"j{i}", "payload": {},
                    "received_at": submitted,
                } for k, kind in enumerate(EVENTS))  # fmt: skip
                if state == "completed":
                    run_rows.append({
                        "job_id": f"j{i}", "is_valid": 1, "observed_at": submitted + timedelta(hours=1),
                        "train_runtime": 3540.0, "dataset_tokens_per_second": 2800.0,
                    })  # fmt: skip
                if state in ENDED:
                    error_rows.append({
                        "job_id": f"j{i}", "model_version": "v0001",
                        "ended_at": submitted + timedelta(hours=1), "predicted_outcome": "valid",
                        "actual_outcome": "valid", "outcome_error": 0,
                        "p_valid": 0.9, "failure_brier": 0.01, "measured_tokens_per_second": 1000.0,
                        "predicted_tokens_per_second": 1100.0, "ape": 0.1,
                    })  # fmt: skip
            connection.execute(insert(Job), job_rows)
            connection.execute(insert(TelemetryEvent), event_rows)
            recommendation_rows, audit_rows = recommendations(first, min(jobs, first + 20_000), jobs)
            connection.execute(insert(Recommendation), recommendation_rows)
            connection.execute(insert(AuditEntry), audit_rows)
            connection.execute(insert(LiveError), error_rows)
            if run_rows:
                connection.execute(insert(ObservedRun), run_rows)


def recommendations(first: int, end: int, jobs: int) -> tuple[list[dict], list[dict]]:
    """The recommendations made while jobs `first` to `end` were submitted, and their audit entries."""
    rows, audit = [], []
    for i in range(first, end, JOBS_PER_RECOMMENDATION):
        made, rec_id = T0 + timedelta(seconds=30 * i), str(uuid.UUID(int=i))
        state = (
            "pending"
            if i >= jobs - 3 * JOBS_PER_RECOMMENDATION
            else DECIDED[i // JOBS_PER_RECOMMENDATION % 9]
        )
        rows.append({
            "id": rec_id, "cluster_id": "default", "kind": "add_nodes", "target": f"nodes:{GPUS[i % 4]}",
            "title": f"add 1 x {GPUS[i % 4]} node", "action": {"delta_nodes": 1}, "effect": {"mean": 0.1},
            "cost": 192.0, "score": 0.1 / 192.0 * (1 + i % 7), "state": state, "source": "schedule",
            "created_at": made, "expires_at": made + timedelta(days=1),
            "decided_at": None if state == "pending" else made + timedelta(minutes=30),
        })  # fmt: skip
        audit.append({"cluster_id": "default", "ts": made, "actor": "system",
                      "subject": f"recommendation:{rec_id}", "from_state": None, "to_state": "pending",
                      "reason": "schedule"})  # fmt: skip
        if state != "pending":
            audit.append({"cluster_id": "default", "ts": made + timedelta(minutes=30), "actor": "system",
                          "subject": f"recommendation:{rec_id}", "from_state": "pending", "to_state": state,
                          "reason": None})  # fmt: skip
    return rows, audit


def store_forecasts(engine: Engine, newest: datetime) -> None:
    """The 100 standing forecasts a store keeps, one every 5 minutes up to `newest`: 24 hourly intervals of
    the six overall figures and four GPU types' utilization (about 30 KB each, as `finetwin up` stores)."""
    edges = [3600.0 * i for i in range(25)]
    band = {
        name: [0.5 + 0.01 * i for i in range(24)] for name in ("mean", "p10", "p90", "raw_p10", "raw_p90")
    }
    figures = ("utilization", "queue_length", "running_jobs", "jobs_completed", "jobs_failed", "energy_kwh")
    for k in range(100):
        start = newest - timedelta(minutes=5 * (99 - k))
        save_forecast(engine, {
            "start": start.isoformat(), "horizon_s": 86400.0, "runs": 16, "seed": k,
            "series": {"t_s": edges[:-1], "interval_end_s": edges[1:], **{f: band for f in figures},
                       "utilization_by_type": {g: band for g in GPUS}},
            "summary": {f: {"mean": 1.0, "p10": 0.5, "p90": 1.5} for f in figures},
        }, cluster_id="default")  # fmt: skip


def timings(url: str, jobs: int, work: Path, repeat: int) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from advisor.app import create_app
    from advisor.auth import Role
    from advisor.keys import create_api_key
    from advisor.parts import ApiParts
    from finetwin.settings import Settings

    engine = make_engine(url)
    migrate(engine)
    fill(engine, jobs)
    analyze(engine)
    newest = T0 + timedelta(seconds=30 * jobs)
    store_forecasts(engine, newest - timedelta(hours=10))
    settings = Settings(data_dir=work / "data", models_dir=work / "models", scheduler_enabled=False)
    key = create_api_key(engine, Role.VIEWER, name="bench", actor="bench")
    out = {}
    with TestClient(create_app(ApiParts.assemble(settings, engine)), headers={"X-API-Key": key}) as client:
        for path in REQUESTS:
            status = client.get(path).status_code
            assert status == 200, (path, status)
            out[path] = best_of(repeat, lambda path=path: client.get(path))
    # What each standing forecast reads of the store (a week of history at the telemetry's newest time).
    out[FORECAST_READ] = best_of(repeat, lambda: load_live_inputs(engine, now=newest))
    engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500_000)
    parser.add_argument("--database-url", help="an empty database for the large store (default: SQLite)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    small_jobs = max(1_000, args.jobs // 100)

    def measure(url: str, jobs: int, work: Path) -> dict[str, float]:
        return timings(url, jobs, work, args.repeat)

    small, big = small_and_large(measure, small_jobs, args.jobs, args.database_url)
    print(f"the API's reads: {args.jobs:,} jobs ({6 * args.jobs:,} events) against {small_jobs:,} jobs "
          f"({6 * small_jobs:,} events), best of {args.repeat}")  # fmt: skip
    labels = {path: f"GET {path}, ms" for path in REQUESTS} | {FORECAST_READ: FORECAST_READ + ", ms"}
    smaller = "the store 100x smaller"
    rows = [(label, big[key] * 1e3, small[key] * 1e3, smaller) for key, label in labels.items()]
    print_table(rows, value="large", baseline="small")


if __name__ == "__main__":
    main()
