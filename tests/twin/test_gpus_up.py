"""Utilization as it happened is a share of the GPUs up at the time, by the nodes' status reports
(twin.gpus_up), not of the nodes up now: hand-made reports, hand-computed GPU-seconds."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine

from finetwin.schema import migrate
from ingest.apply import apply_events
from ingest.events import NodeStatus, new_event
from tests.twin.query_plans import sqlite_plans
from twin.actuals import actual_series, load_job_times
from twin.db import make_engine, session_scope
from twin.forecast_store import save_forecast
from twin.gpus_up import GpusUp, gpus_up_from_reports
from twin.skill import forecast_vs_actual
from twin.store import Job

T0 = datetime(2025, 3, 1, tzinfo=UTC)
H = 3600.0
A100 = "NVIDIA-A100-SXM4-80GB"
L40S = "L40S"
H100 = "NVIDIA-H100-PCIe"


def report(node_id: str, model: str, gpus: int, status: str) -> dict[str, object]:
    return {"node_id": node_id, "gpu_model": model, "gpu_count": gpus, "status": status}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_gpus_up_follow_each_nodes_latest_report_whatever_the_order_they_arrive_in() -> None:
    reports = [
        (at(100), report("n1", A100, 8, "up")),
        (at(400), report("n2", L40S, 4, "up")),
        (at(300), report("n1", A100, 8, "down")),
        (at(0), report("n0", A100, 8, "up")),
        (at(200), report("n0", A100, 8, "drain")),  # takes no new job: its GPUs serve none
        (at(300), report("n1", A100, 8, "up")),  # two at one instant: the store keeps the larger, up
    ]
    gpus = gpus_up_from_reports(reports, "default", T0)
    up = gpus.seconds_up([-100.0, 0.0, 150.0, 500.0])
    # A100: 8 from 0, 16 from 100, 8 from 200 (n0 drains; n1 stays up). L40S: 4 from 400.
    assert set(up) == {A100, L40S}
    assert up[A100].tolist() == [0.0, 8 * 100 + 16 * 50, 16 * 50 + 8 * 300]
    assert up[L40S].tolist() == [0.0, 0.0, 4 * 100]
    constant = GpusUp.constant(T0, {A100: 8, H100: 0}).seconds_up([-50.0, 0.0, 150.0])
    assert constant == {A100: pytest.approx([8 * 50, 8 * 150])}


def record(engine: Engine) -> None:
    """Window [T0, T0 + 3 h). Nodes a and b (8 A100 each) up an hour before; b down from 1 h to 1.5 h; c
    (4 L40S) up from 2.5 h; d (8 H100) up only after the window. Job x holds 8 A100s from 10 min before
    T0; job y 4 L40S from 2 h 45 min."""
    nodes = [
        (-H, "a", A100, 8, "up"), (-H, "b", A100, 8, "up"), (H, "b", A100, 8, "down"),
        (1.5 * H, "b", A100, 8, "up"), (2.5 * H, "c", L40S, 4, "up"), (5 * H, "d", H100, 8, "up"),
    ]  # fmt: skip
    apply_events(
        engine,
        [
            new_event("node.status", NodeStatus(**report(node, model, gpus, status)), job_id=None, ts=at(t))
            for t, node, model, gpus, status in nodes
        ],
    )
    config = {"model_name": "llama3-8b", "method": "lora", "number_nodes": 1, "batch_size": 16,
              "tokens_per_sample": 1024, "updated_at": T0}  # fmt: skip
    with session_scope(engine) as session:
        session.add(Job(job_id="x", state="running", gpu_model=A100, number_gpus=8, submitted_at=at(-900),
                        started_at=at(-600), **config))  # fmt: skip
        session.add(Job(job_id="y", state="running", gpu_model=L40S, number_gpus=4, submitted_at=at(2.75 * H),
                        started_at=at(2.75 * H), **config))  # fmt: skip


def test_utilization_on_record_is_a_share_of_the_gpus_up_at_the_time(engine: Engine) -> None:
    record(engine)
    times = load_job_times(engine, "default", T0, at(3 * H))
    actual = actual_series(times, [0.0, H, 2 * H, 3 * H])
    # A100 GPU-hours up: 16, 8 x 0.5 + 16 x 0.5 = 12, 16; L40S: none, none, 4 x 0.5 = 2. The H100s came
    # after: no figure of theirs. Held: x's 8 A100 each hour, y's 4 L40S for the last quarter hour.
    assert actual["utilization/" + A100].tolist() == pytest.approx([8 / 16, 8 / 12, 8 / 16])
    l40s = actual["utilization/" + L40S]
    assert np.isnan(l40s[:2]).all() and l40s[2] == pytest.approx(1 / 2)
    assert actual["utilization"].tolist() == pytest.approx([8 / 16, 8 / 12, (8 + 1) / (16 + 2)])
    assert "utilization/" + H100 not in actual


def test_an_hour_with_no_gpu_up_has_no_utilization_on_record_not_zero(engine: Engine) -> None:
    """The record began with the nodes' first reports an hour before T0: the hour before that has no data,
    and the forecast drawn against what happened says so (null, not 0 % nor NaN in the JSON)."""
    record(engine)
    start = at(-2 * H)
    times = load_job_times(engine, "default", start, at(0))
    assert math.isnan(actual_series(times, [0.0, H, 2 * H])["utilization"][0])
    series = {
        "t_s": [0.0, H],
        "interval_end_s": [H, 2 * H],
        "utilization": {"mean": [0.5, 0.5], "p10": [0.4, 0.4], "p90": [0.6, 0.6]},
    }
    save_forecast(
        engine, {"start": start.isoformat(), "horizon_s": 2 * H, "series": series}, cluster_id="default"
    )
    view = forecast_vs_actual(engine, "default", at(0))
    assert view is not None and view["intervals_passed"] == 2
    assert view["figures"]["utilization"]["actual"] == [
        None,
        pytest.approx(8 * 600 / (16 * H)),
    ]  # x from -10 min
    json.dumps(view, allow_nan=False)


def test_sqlite_reads_the_node_reports_from_their_own_index(tmp_path: Path) -> None:
    """Next to thousands of job events per node report, a full scan of the events would grow with the
    record: the reports are read through the partial index that holds only them."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    plans = sqlite_plans(engine, lambda: load_job_times(engine, "default", T0, at(H)))
    (node_plan,) = [plan for statement, plan in plans.items() if "node.status" in statement]
    assert "ix_telemetry_events_node_status" in node_plan
    engine.dispose()
