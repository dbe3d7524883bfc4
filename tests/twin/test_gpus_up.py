"""Utilization as it happened is a share of the GPUs up at the time, by the nodes' status reports
(twin.gpus_up), not of the nodes up now: hand-made reports, hand-computed GPU-seconds."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from finetwin.schema import migrate
from ingest.apply import apply_events
from ingest.events import NodeStatus, new_event
from tests.twin.gpus_up_checks import assert_window_reads_as_every_report_folded
from tests.twin.query_plans import sqlite_plans
from twin.actuals import actual_series, load_job_times
from twin.db import make_engine, session_scope
from twin.forecast_store import save_forecast
from twin.gpus_up import NodeReport, gpus_up_from_reports, load_gpus_up
from twin.skill import forecast_vs_actual
from twin.store import Job

T0 = datetime(2025, 3, 1, tzinfo=UTC)
H = 3600.0
A100 = "NVIDIA-A100-SXM4-80GB"
L40S = "L40S"
H100 = "NVIDIA-H100-PCIe"


def report(node_id: str, model: str, gpus: int, status: str) -> dict[str, object]:
    return {"node_id": node_id, "gpu_model": model, "gpu_count": gpus, "status": status}


def node_report(seconds: float, node_id: str, model: str, gpus: int, status: str) -> NodeReport:
    return NodeReport(node_id, at(seconds), status, gpus, model)


def store_reports(engine: Engine, reports: Iterable[NodeReport]) -> None:
    """The reports through ingest, as `node.status` telemetry: the events kept and the nodes' rows."""
    events = [NodeStatus(**report(r.node_id, r.gpu_model, r.gpu_count, r.status)) for r in reports]
    apply_events(
        engine,
        [new_event("node.status", e, job_id=None, ts=r.ts) for e, r in zip(events, reports, strict=True)],
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_gpus_up_follow_each_nodes_latest_report_whatever_the_order_they_arrive_in() -> None:
    reports = [
        node_report(100, "n1", A100, 8, "up"),
        node_report(400, "n2", L40S, 4, "up"),
        node_report(300, "n1", A100, 8, "down"),
        node_report(0, "n0", A100, 8, "up"),
        node_report(200, "n0", A100, 8, "drain"),  # takes no new job: its GPUs serve none
        node_report(300, "n1", A100, 8, "up"),  # two at one instant: the store keeps the larger, up
    ]
    gpus = gpus_up_from_reports(reports, T0)
    up = gpus.seconds_up([-100.0, 0.0, 150.0, 500.0])
    # A100: 8 from 0, 16 from 100, 8 from 200 (n0 drains; n1 stays up). L40S: 4 from 400.
    assert set(up) == {A100, L40S}
    assert up[A100].tolist() == [0.0, 8 * 100 + 16 * 50, 16 * 50 + 8 * 300]
    assert up[L40S].tolist() == [0.0, 0.0, 4 * 100]
    # A state from before any time asked about (a node's row): up throughout.
    before = {"n": node_report(-1e6, "n", A100, 8, "up"), "h": node_report(-1e6, "h", H100, 8, "down")}
    constant = gpus_up_from_reports([], T0, before).seconds_up([-50.0, 0.0, 150.0])
    assert constant == {A100: pytest.approx([8 * 50, 8 * 150])}


def record(engine: Engine) -> None:
    """Window [T0, T0 + 3 h). Nodes a and b (8 A100 each) up an hour before; b down from 1 h to 1.5 h; c
    (4 L40S) up from 2.5 h; d (8 H100) up only after the window. Job x holds 8 A100s from 10 min before
    T0; job y 4 L40S from 2 h 45 min."""
    store_reports(engine, [
        node_report(-H, "a", A100, 8, "up"), node_report(-H, "b", A100, 8, "up"),
        node_report(H, "b", A100, 8, "down"), node_report(1.5 * H, "b", A100, 8, "up"),
        node_report(2.5 * H, "c", L40S, 4, "up"), node_report(5 * H, "d", H100, 8, "up"),
    ])  # fmt: skip
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
    x_from_10_min_before = pytest.approx(8 * 600 / (16 * H))
    assert view["figures"]["utilization"]["actual"] == [None, x_from_10_min_before]
    json.dumps(view, allow_nan=False)


def test_sqlite_reads_the_node_reports_from_their_own_index(tmp_path: Path) -> None:
    """Next to thousands of job events per node report, a full scan of the events would grow with the
    record: the reports are read from the table of the reports that change something, by its index: the
    window's, the scan back from its start (b reported in it) and the one forward from its end (d reported
    after it). No event is read."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    record(engine)
    plans = sqlite_plans(engine, lambda: load_job_times(engine, "default", T0, at(2 * H)))
    node_plans = [plan for statement, plan in plans.items() if "node_status_changes" in statement]
    assert len(node_plans) == 3, node_plans
    assert all("ix_node_status_changes_cluster_ts" in plan for plan in node_plans), node_plans
    assert not any("node.status" in statement for statement in plans)
    engine.dispose()


def random_reports(seed: int, count: int) -> list[NodeReport]:
    """Six nodes of two types reporting at random over a day, up, down or draining, some at one instant."""
    rng = np.random.default_rng(seed)
    models = {f"n{k}": (A100 if k % 2 else L40S, 8 if k % 2 else 4) for k in range(6)}
    reports = []
    for _ in range(count):
        node = f"n{rng.integers(0, 6)}"
        seconds = float(rng.integers(0, 48)) * 1800.0  # on the half hour: reports of one instant happen
        reports.append(
            node_report(seconds, node, *models[node], str(rng.choice(["up", "up", "down", "drain"])))
        )
    return reports


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_window_read_from_the_store_is_the_whole_record_folded(engine: Engine, seed: int) -> None:
    """Reading a window (its reports, each node's latest one before it, the rows of nodes quiet since)
    gives the GPUs up that folding every report gives, for windows that start and end anywhere."""
    reports = random_reports(seed, 120)
    store_reports(engine, reports)
    rng = np.random.default_rng(seed + 100)
    for _ in range(6):
        start, length = float(rng.uniform(-3 * H, 24 * H)), float(rng.uniform(0.5 * H, 30 * H))
        assert_window_reads_as_every_report_folded(engine, reports, at(start), at(start + length))


def test_a_window_reads_one_report_per_node_from_before_it(engine: Engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two nodes that reported every minute for a day, up all along: the state they were in when the window
    began is read from their one report that changed something each (the first: every later one is a
    heartbeat), not by reading the day."""
    from twin import gpus_up

    minutes = [node_report(60.0 * k, node, A100, 8, "up") for k in range(-24 * 60, 60) for node in ("a", "b")]
    store_reports(engine, minutes)
    read: list[NodeReport] = []
    scan = gpus_up._scan

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        for r in scan(*args, **kwargs):
            if r.ts < T0:
                read.append(r)
            yield r

    monkeypatch.setattr(gpus_up, "_scan", counted)
    with Session(engine) as session:
        up = load_gpus_up(session, "default", T0, at(H)).seconds_up([0.0, H])
    assert up == {A100: pytest.approx([16 * H])}
    assert sorted(r.ts for r in read) == [at(-24 * H)] * 2, read


def test_the_scan_back_from_a_window_stops_at_each_nodes_latest_change(engine: Engine, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two nodes whose every report for a day changed something (up, draining, up, ...): their state when
    the window began is found by a scan back that stops there (3 reports: one past the last found), not by
    reading the day."""
    from twin import gpus_up

    minutes = [node_report(60.0 * k, node, A100, 8, "up" if k % 2 else "drain")
               for k in range(-24 * 60, 60) for node in ("a", "b")]  # fmt: skip
    store_reports(engine, minutes)
    read: list[NodeReport] = []
    scan = gpus_up._scan

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        for r in scan(*args, **kwargs):
            if r.ts < T0 + timedelta(seconds=90):
                read.append(r)
            yield r

    monkeypatch.setattr(gpus_up, "_scan", counted)
    origin, until = at(90), at(H)
    with Session(engine) as session:
        up = load_gpus_up(session, "default", origin, until).seconds_up([0.0, H - 90])
    assert up == gpus_up_from_reports([r for r in minutes if r.ts < until], origin).seconds_up([0.0, H - 90])
    assert len(read) == 3, read


def test_of_two_reports_at_the_instant_before_the_window_the_larger_stands(engine: Engine) -> None:
    """A node reported up and down at one instant before the window: the store keeps the larger, up, and so
    does the scan back from the window, whichever of the two it meets first (two nodes, stored in
    opposite orders)."""
    for node, order in (("a", ("up", "down")), ("b", ("down", "up"))):
        for status in order:  # one at a time: stored in this order
            store_reports(engine, [node_report(-H, node, A100, 8, status)])
    with Session(engine) as session:
        up = load_gpus_up(session, "default", T0, at(H)).seconds_up([0.0, H])
    assert up == {A100: pytest.approx([16 * H])}
