"""The store keeps FINETWIN_KEEP_TELEMETRY_DAYS of telemetry (`twin.retention`): pruning deletes what nothing
reads any more and keeps what a backtest, a live forecast and the skill read; ingest refuses what would land
before the record; a backtest asks for no more than the record holds. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine, func
from sqlmodel import Session, select

from finetwin.settings import Settings
from ingest.apply import apply_events
from ingest.bus import InProcessBus, Record
from ingest.events import Event, JobProgress, JobStarted, NodeStatus, new_event
from ingest.replay import plan_replay
from ingest.worker import IngestWorker
from tests.ingest.test_apply import COMPLETED, SUBMITTED
from tests.twin.test_skill import T0, random_scores
from tests.twin.test_store_backtest import apply_shuffled, assert_same_backtest_start, store_jobs
from twin.rebuild import backtest_states
from twin.retention import kept_from, prune, prune_due
from twin.skill import skill
from twin.store import Job, NodeStatusChange, TelemetryEvent
from twin.store_backtest import check_window

EPOCH = datetime(2025, 5, 1, tzinfo=UTC)
LOOKBACK, HORIZON = timedelta(minutes=30), timedelta(hours=1)


@pytest.fixture(scope="module")
def replay_events(sample_csv: Path) -> tuple[list, float, dict[str, str]]:
    """A replay of 150 real rows, every node reporting every 10 minutes, and a job submitted at the start
    that is still queued at the end: (events, the replay's length in seconds, the nodes)."""
    from calibrate.loader import load_benchmark

    rows: pd.DataFrame = load_benchmark(sample_csv).head(150)
    plan = plan_replay(rows, seed=3, epoch=EPOCH)
    events = [e for _, e in plan.events]
    for node_id, gpu in plan.nodes.items():
        for minute in range(1, int(plan.duration_s // 60), 10):
            status = "down" if node_id == list(plan.nodes)[1] and 100 <= minute < 200 else "up"
            report = NodeStatus(node_id=node_id, gpu_model=gpu, gpu_count=8, status=status)
            events.append(new_event("node.status", report, job_id=None, ts=EPOCH + timedelta(minutes=minute)))
    config = next(e for e in events if e.type == "job.submitted").payload
    events.append(new_event("job.submitted", config, job_id="still-queued", ts=EPOCH + timedelta(seconds=5)))
    return events, plan.duration_s, plan.nodes


def latest_changes_before(engine: Engine, before: datetime) -> dict[str, tuple]:
    with Session(engine) as session:
        rows = session.exec(select(NodeStatusChange).where(NodeStatusChange.ts < before)).all()
    latest: dict[str, tuple] = {}
    for row in sorted(rows, key=lambda r: r.ts):
        latest[row.node_id] = (row.event_id, row.status, row.gpu_count)
    return latest


def test_pruning_keeps_what_a_backtest_reads_and_deletes_the_rest(
    engine: Engine, replay_events: tuple[list, float, dict[str, str]]
) -> None:
    events, duration_s, nodes = replay_events
    apply_shuffled(engine, events, seed=4)
    horizon = EPOCH + timedelta(seconds=duration_s * 0.5)
    at = horizon + LOOKBACK + timedelta(minutes=20)
    assert at + HORIZON < EPOCH + timedelta(seconds=duration_s)
    want = backtest_states(engine, "default", at, at + HORIZON, LOOKBACK)
    jobs_before = store_jobs(engine)
    nodes_at_horizon = latest_changes_before(engine, horizon)
    assert len(nodes_at_horizon) == len(nodes)

    counted = prune(engine, "default", horizon, dry_run=True)
    assert kept_from(engine, "default") is None  # a dry run deletes and records nothing
    pruned = prune(engine, "default", horizon, chunk=37)  # many chunks, each read from the last one's time
    assert (pruned.events, pruned.node_changes) == (counted.events, counted.node_changes)
    assert pruned.events > len(nodes) * 10 and pruned.node_changes > 0
    assert kept_from(engine, "default") == horizon

    # What is left before the horizon: the events of jobs still open then, nothing of the nodes' reports.
    with Session(engine) as session:
        left = session.exec(
            select(TelemetryEvent.type, TelemetryEvent.job_id, Job.ended_at)
            .join(Job, Job.job_id == TelemetryEvent.job_id, isouter=True)
            .where(TelemetryEvent.ts < horizon)
        ).all()
    assert "still-queued" in {job_id for _, job_id, _ in left}
    assert all(kind != "node.status" for kind, _, _ in left)
    assert all(end is None or end.replace(tzinfo=UTC) >= horizon for _, _, end in left)
    # Each node's latest change before the horizon stays: the state its history starts from.
    assert latest_changes_before(engine, horizon) == nodes_at_horizon
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(NodeStatusChange).where(
            NodeStatusChange.ts < horizon)).one() == len(nodes)  # fmt: skip
    # The jobs' rows are the same, and a backtest whose window is after the horizon starts where it did.
    assert store_jobs(engine) == jobs_before
    assert_same_backtest_start(
        backtest_states(engine, "default", at, at + HORIZON, LOOKBACK), want, at, at + HORIZON
    )

    # Again: nothing more to delete. An earlier horizon does not move it back.
    again = prune(engine, "default", horizon - timedelta(hours=1))
    assert (again.kept_from, again.events, again.node_changes, again.scores) == (horizon, 0, 0, 0)
    assert kept_from(engine, "default") == horizon


def test_a_backtest_reaching_before_the_record_is_refused_with_the_earliest_t(engine: Engine) -> None:
    up = NodeStatus(node_id="a100-0", gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=8, status="up")
    apply_events(
        engine, [new_event("node.status", up, job_id=None, ts=T0 + timedelta(hours=k)) for k in range(48)]
    )
    check_window(engine, "default", T0 + timedelta(hours=1), T0 + timedelta(hours=2), LOOKBACK)
    horizon = T0 + timedelta(hours=20)
    prune(engine, "default", horizon)
    earliest = re.escape((horizon + LOOKBACK).isoformat())
    with pytest.raises(ValueError, match=f"FINETWIN_KEEP_TELEMETRY_DAYS.*the earliest T is {earliest}"):
        check_window(
            engine, "default", horizon + timedelta(minutes=10), horizon + timedelta(hours=2), LOOKBACK
        )
    check_window(engine, "default", horizon + LOOKBACK, horizon + LOOKBACK + timedelta(hours=1), LOOKBACK)


@pytest.mark.parametrize(
    "since",
    [
        None,
        T0 + timedelta(days=2),  # the horizon's day, from its midnight
        T0 + timedelta(days=2, hours=5, minutes=30),  # inside the horizon's day, before it: its scores stay
    ],
)
def test_the_skill_is_the_same_once_the_old_scores_are_pruned(engine: Engine, since: datetime | None) -> None:
    random_scores(engine, forecasts=18)
    before = skill(engine, "default", since=since)
    pruned = prune(engine, "default", T0 + timedelta(days=2, hours=9))
    assert pruned.scores > 0  # the scores of the first two days
    assert skill(engine, "default", since=since) == before


def test_a_skill_window_that_starts_on_a_pruned_day_starts_at_its_midnight(engine: Engine) -> None:
    random_scores(engine, forecasts=18)
    prune(engine, "default", T0 + timedelta(days=2, hours=9))
    midday = skill(engine, "default", since=T0 + timedelta(days=1, hours=13))
    assert midday == skill(engine, "default", since=T0 + timedelta(days=1))


PAYLOADS = {
    "job.submitted": SUBMITTED,
    "job.started": JobStarted(node_ids=["n-0"]),
    "job.completed": COMPLETED,
}


def job_at(job_id: str, minutes: float, kind: str = "job.submitted", payload: object = None) -> Event:
    return new_event(kind, payload or PAYLOADS[kind], job_id=job_id, ts=T0 + timedelta(minutes=minutes))


def test_an_event_from_before_the_record_is_dead_lettered_unless_its_job_is_still_open(
    engine: Engine,
) -> None:
    """After a prune, a redelivered event of a job that ended before the horizon would be applied a second
    time (its first copy is gone): it is dead-lettered, with why, as is a node's report from before it. An
    event of a job still open at the horizon, or of a job the store never saw, is applied."""
    ended = [job_at("ended", 0), job_at("ended", 1, "job.started"), job_at("ended", 5, "job.completed")]
    still_open = [job_at("open", 2), job_at("open", 3, "job.started")]
    up = NodeStatus(node_id="n-0", gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=8, status="up")
    reports = [new_event("node.status", up, job_id=None, ts=T0 + timedelta(minutes=m)) for m in (0, 30, 90)]
    apply_events(engine, ended + still_open + reports)
    ended_row = store_jobs(engine)["ended"]
    prune(engine, "default", T0 + timedelta(minutes=60))

    down = NodeStatus(node_id="n-0", gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=8, status="down")
    late = [
        ended[2],  # redelivered: its job ended before the horizon
        new_event("node.status", down, job_id=None, ts=T0 + timedelta(minutes=45)),
        job_at("open", 10, "job.progress", JobProgress(tokens_processed=1e6, tokens_per_second=900.0)),
        job_at("never-seen", 4),  # a job the store never saw: all of it is before the horizon, and kept
        new_event("node.status", down, job_id=None, ts=T0 + timedelta(minutes=95)),
    ]
    bus = InProcessBus()
    worker = IngestWorker(engine, bus.consumer("t", "g"), bus.producer(), dlq_topic="t.dlq")
    sources = [Record("t", 0, n, None, b"") for n in range(len(late))]
    result, refused = worker.apply_isolating(late, sources)  # type: ignore[arg-type]
    assert (result.applied, result.duplicates) == (3, 0)
    assert [(letter.message.offset, letter.kind) for letter in refused] == [
        (0, "before_retention"),
        (1, "before_retention"),
    ]
    assert (
        "of job 'ended', which ended" in refused[0].detail
        and "FINETWIN_KEEP_TELEMETRY_DAYS" in refused[0].detail
    )
    assert "a node's report dated" in refused[1].detail
    jobs = store_jobs(engine)
    assert jobs["ended"] == ended_row
    assert jobs["open"]["tokens_processed"] == 1e6 and "never-seen" in jobs
    with Session(engine) as session:
        stored = set(session.exec(select(TelemetryEvent.event_id)).all())
    assert {str(e.event_id) for e in late[:2]}.isdisjoint(stored)


def test_the_settings_keep_more_than_the_lookback(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().keep_telemetry_days == 30
    monkeypatch.setenv("FINETWIN_FORECAST_LOOKBACK_DAYS", "60")  # a long lookback, and no retention set
    assert Settings().keep_telemetry_days == 67
    monkeypatch.delenv("FINETWIN_FORECAST_LOOKBACK_DAYS")
    monkeypatch.setenv("FINETWIN_KEEP_TELEMETRY_DAYS", "5")  # set: refused at or below the lookback
    with pytest.raises(ValueError, match=r"must be more than FINETWIN_FORECAST_LOOKBACK_DAYS \(7\)"):
        Settings()
    monkeypatch.setenv("FINETWIN_KEEP_TELEMETRY_DAYS", "0")  # keeps everything
    assert prune_due(None, Settings()) is None  # type: ignore[arg-type]


def test_finetwin_prune_deletes_what_its_dry_run_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from finetwin.cli import main
    from finetwin.wiring import migrated_engine

    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path))
    engine = migrated_engine(Settings())
    up = NodeStatus(node_id="n-0", gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=8, status="up")
    days = 40
    apply_events(
        engine,
        [new_event("node.status", up, job_id=None, ts=T0 + timedelta(hours=h)) for h in range(24 * days)],
    )
    assert main(["prune", "--dry-run", "--json"]) == 0
    counted = json.loads(capsys.readouterr().out)
    # Telemetry time, not the wall clock's: 30 days back from the newest report (2025).
    newest = T0 + timedelta(hours=24 * days - 1)
    assert counted["dry_run"] and counted["kept_from"] == (newest - timedelta(days=30)).isoformat()
    assert counted["events"] == 24 * (days - 30) - 1 and kept_from(engine, "default") is None
    assert main(["prune"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"deleted {counted['events']:,} events" in said
    with Session(engine) as session:
        assert (
            session.exec(select(func.count()).select_from(TelemetryEvent)).one()
            == 24 * days - counted["events"]
        )
    assert main(["prune", "--keep-days", "3"]) == 2
    assert "--keep-days: " in capsys.readouterr().err
    # A backtest reads the lookback live forecasts read: it may start that long after the horizon.
    monkeypatch.setenv("FINETWIN_FORECAST_LOOKBACK_DAYS", "2")
    horizon = datetime.fromisoformat(counted["kept_from"])
    at = (horizon + timedelta(days=1)).isoformat()
    assert main(["backtest", "--from-store", "--at", at, "--horizon", "1h"]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert (
        "less the 2 d of history" in said
        and f"the earliest T is {(horizon + timedelta(days=2)).isoformat()}" in said
    )
    engine.dispose()


def test_the_api_prunes_its_store_on_its_schedule(engine: Engine, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from tests.advisor.conftest import advisor_settings
    from tests.advisor.fakes import FakeInUse
    from tests.conftest import api_app, wait_for

    up = NodeStatus(node_id="n-0", gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=8, status="up")
    hours = 24 * 35
    apply_events(
        engine, [new_event("node.status", up, job_id=None, ts=T0 + timedelta(hours=h)) for h in range(hours)]
    )
    settings = advisor_settings(tmp_path, scheduler_enabled=True, keep_telemetry_days=31)
    with TestClient(api_app(settings, engine, FakeInUse(None))) as client:
        wait_for(lambda: kept_from(engine, "default") is not None, 60, "the API's first prune")
        horizon = T0 + timedelta(hours=hours - 1, days=-31)
        scraped = re.search(
            r'^finetwin_telemetry_kept_from_seconds\{cluster="default"\} (\S+)$',
            client.get("/metrics").text,
            re.M,
        )
        assert scraped is not None and float(scraped.group(1)) == horizon.timestamp()
    assert kept_from(engine, "default") == horizon
    with Session(engine) as session:
        assert session.exec(select(func.count()).select_from(TelemetryEvent)).one() == 31 * 24 + 1
