"""Running jobs that need attention: past their time limit with no end reported (overdue), or silent past
their last progress report (stalled). A job whose end was lost stayed `running` for good, and nothing said
so; a hung job looked like any other."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from finetwin.settings import Settings
from tests.conftest import api_app, api_headers
from twin.db import session_scope
from twin.job_health import DEFAULT_GRACE, attention
from twin.live_state import load_cluster_inputs
from twin.store import Job, Node, utcnow

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"


UNKNOWN_LIFE = {"state": "running", "started_at": None, "time_limit_s": None, "progress_at": None}


def running(**life: Any) -> SimpleNamespace:
    return SimpleNamespace(**(UNKNOWN_LIFE | life))


@pytest.mark.parametrize(
    ("job", "kind"),
    [
        # Limit 600 s, started 40 min ago: 30 min past it, within the grace; a second more: overdue.
        (running(started_at=NOW - timedelta(minutes=40), time_limit_s=600.0), None),
        (running(started_at=NOW - timedelta(minutes=40, seconds=1), time_limit_s=600.0), "overdue"),
        # Progress 30 min ago: not yet; 31 min ago: stalled.
        (running(started_at=NOW - timedelta(hours=5), progress_at=NOW - timedelta(minutes=30)), None),
        (running(started_at=NOW - timedelta(hours=5), progress_at=NOW - timedelta(minutes=31)), "stalled"),
        # Both: the limit is certain, the silence a guess.
        (running(started_at=NOW - timedelta(hours=5), time_limit_s=6e2, progress_at=NOW - timedelta(hours=4)),
         "overdue"),
        # Never reported progress, no limit: a long job, not told from a lost one.
        (running(started_at=NOW - timedelta(days=30)), None),
        # Not running: nothing to say, whatever its times.
        (running(state="completed", started_at=NOW - timedelta(days=1), time_limit_s=1.0), None),
        (running(state="submitted", progress_at=NOW - timedelta(days=1)), None),
        # Stored without a time zone (SQLite): read as UTC.
        (running(started_at=(NOW - timedelta(hours=2)).replace(tzinfo=None), time_limit_s=60.0), "overdue"),
    ],
)  # fmt: skip
def test_a_running_job_needs_attention_past_its_limit_or_its_last_progress(
    job: Any, kind: str | None
) -> None:
    said = attention(job, NOW, DEFAULT_GRACE)
    assert (said.kind if said else None) == kind
    if said is not None:
        assert said.since < NOW and said.why


def test_the_grace_is_the_operators_to_set() -> None:
    job = running(started_at=NOW - timedelta(hours=1), progress_at=NOW - timedelta(minutes=10))
    assert attention(job, NOW, timedelta(minutes=30)) is None
    said = attention(job, NOW, timedelta(minutes=5))
    assert said is not None and said.kind == "stalled" and said.since == NOW - timedelta(minutes=5)
    assert said.why.startswith("no progress reported for 10 min")


def seed(engine: Engine, now: datetime) -> None:
    """Jobs dated from `now` (the wall clock: no telemetry events, so the twin's clock is the wall's)."""
    base = {"model_name": "llama3-8b", "method": "lora", "gpu_model": A100, "number_gpus": 8,
            "number_nodes": 1, "batch_size": 128, "tokens_per_sample": 2048, "dataset_tokens": 3e8,
            "submitted_at": now - timedelta(hours=6), "updated_at": now}  # fmt: skip
    with session_scope(engine) as session:
        for k in range(4):
            session.add(Node(node_id=f"a100-{k}", gpu_model=A100, gpu_count=8, status="up", updated_at=now))
        session.add(Job(job_id="lost-end", state="running", started_at=now - timedelta(hours=3),
                        time_limit_s=600.0, node_ids=["a100-0"], **base))  # fmt: skip
        session.add(Job(job_id="hung", state="running", started_at=now - timedelta(hours=4),
                        progress_at=now - timedelta(hours=2), tokens_processed=1e8,
                        last_tokens_per_second=1e4, node_ids=["a100-1"], **base))  # fmt: skip
        session.add(Job(job_id="fine", state="running", started_at=now - timedelta(hours=1),
                        progress_at=now - timedelta(minutes=2), node_ids=["a100-2"], **base))  # fmt: skip
        session.add(Job(job_id="done", state="completed", started_at=now - timedelta(hours=5),
                        ended_at=now - timedelta(hours=4), time_limit_s=600.0, **base))  # fmt: skip


def test_the_api_the_metrics_and_the_forecast_say_which_jobs_need_attention(
    engine: Engine, tmp_path: Path
) -> None:
    seed(engine, utcnow())
    settings = Settings(data_dir=tmp_path / "data", models_dir=tmp_path / "models", scheduler_enabled=False)
    with TestClient(api_app(settings, engine)) as client:
        headers = api_headers(engine, "viewer")
        listed = client.get("/v1/jobs", headers=headers).json()["jobs"]
        said = {j["job_id"]: j["attention"] for j in listed}
        assert said["lost-end"]["kind"] == "overdue" and "time limit of 10 min" in said["lost-end"]["why"]
        assert said["hung"]["kind"] == "stalled" and "no progress reported for 2.0 h" in said["hung"]["why"]
        assert said["fine"] is None and said["done"] is None
        assert client.get("/v1/jobs/hung", headers=headers).json()["attention"]["kind"] == "stalled"
        assert client.get("/v1/jobs/done", headers=headers).json()["attention"] is None
        for kind, expected in (
            ("any", {"lost-end", "hung"}),
            ("overdue", {"lost-end"}),
            ("stalled", {"hung"}),
        ):
            page = client.get("/v1/jobs", params={"attention": kind}, headers=headers).json()
            assert {j["job_id"] for j in page["jobs"]} == expected and page["total"] == len(expected), kind
        paged = client.get("/v1/jobs", params={"attention": "any", "limit": 1, "offset": 1}, headers=headers)
        assert paged.json()["total"] == 2 and len(paged.json()["jobs"]) == 1
        other = client.get("/v1/jobs", params={"attention": "any", "state": "submitted"}, headers=headers)
        assert other.json()["total"] == 0
        bad = client.get("/v1/jobs", params={"attention": "late"}, headers=headers)
        assert bad.status_code == 422 and "attention" in bad.text
        assert client.get("/v1/cluster", headers=headers).json()["attention"] == {"overdue": 1, "stalled": 1}
        metrics = client.get("/metrics").text
        assert 'finetwin_jobs_needing_attention{cluster="default",kind="overdue"} 1.0' in metrics
        assert 'finetwin_jobs_needing_attention{cluster="default",kind="stalled"} 1.0' in metrics
    notes = " ".join(load_cluster_inputs(engine, settings).notes)
    assert "1 running job(s) past their time limit with no end reported" in notes
    assert "1 running job(s) have reported no progress for over 30 min" in notes
    # A longer grace: the hung job's two hours are within it, the lost end's 2 h 50 min past its limit too.
    patient = settings.model_copy(update={"job_attention_minutes": 180.0})
    assert "need" not in " ".join(load_cluster_inputs(engine, patient).notes)
    assert all("running job(s)" not in note for note in load_cluster_inputs(engine, patient).notes)
