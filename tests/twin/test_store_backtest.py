"""Backtest from the store: the state at T rebuilt from the stored events equals what the store held at T,
job by job, whatever order the events were delivered in; the backtest uses the model version in use at T and
never one fitted on what came after."""

from __future__ import annotations

import json
import random
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine, delete
from sqlmodel import Session, col, select

from calibrate.loader import load_benchmark
from calibrate.registry import ModelRegistry
from finetwin.schema import migrate
from ingest.apply import apply_events
from ingest.events import JobRejected, JobStarted, NodeStatus, new_event
from ingest.replay import plan_replay
from tests.twin.query_plans import sqlite_plans
from twin.db import make_engine
from twin.domain import Rule
from twin.rebuild import BacktestStates, backtest_states, fold_events, rebuild_at, stored_events
from twin.store import Job, JobRecord, Node, TelemetryEvent

COMPARED = (
    "state", "outcome", "submitted_at", "started_at", "ended_at", "node_ids", "tokens_processed",
    "last_tokens_per_second", "last_power_watts", "failed_after_s", "rule", "model_name", "method",
    "gpu_model", "number_gpus", "batch_size", "dataset_tokens", "experiment_id",
)  # fmt: skip


def apply_shuffled(
    engine: Engine, events: list, seed: int, *, max_batch: int = 40, repeated: float = 0.2
) -> None:
    """Delivered out of order, in batches of 1 to `max_batch`, each event once, a share `repeated` of them
    twice."""
    rng = random.Random(seed)
    shuffled = events + rng.sample(events, int(len(events) * repeated))
    rng.shuffle(shuffled)
    while shuffled:
        size = rng.randint(1, max_batch)
        apply_events(engine, shuffled[:size])
        shuffled = shuffled[size:]


def utc(ts: datetime | None) -> datetime | None:
    return None if ts is None else (ts if ts.tzinfo else ts.replace(tzinfo=UTC))


def store_jobs(engine: Engine) -> dict[str, dict[str, object]]:
    with Session(engine) as session:
        jobs = session.exec(select(Job)).all()
    return {j.job_id: {c: utc(getattr(j, c)) if c.endswith("_at") else getattr(j, c) for c in COMPARED}
            for j in jobs}  # fmt: skip


@pytest.fixture(scope="module")
def sample_rows(sample_csv: Path) -> pd.DataFrame:
    return load_benchmark(sample_csv).head(150)


def test_the_state_rebuilt_at_t_equals_the_store_at_t_job_by_job(
    engine: Engine, sample_rows: pd.DataFrame, tmp_path: Path
) -> None:
    plan = plan_replay(sample_rows, seed=3, epoch=datetime(2025, 5, 1, tzinfo=UTC))
    events = [e for _, e in plan.events]
    apply_shuffled(engine, events, seed=1)
    for fraction in (0.2, 0.55, 0.9):
        at = plan.epoch + timedelta(seconds=plan.duration_s * fraction)
        # What the store held at T: a second store that only ever received the events dated by T.
        then = make_engine(f"sqlite:///{tmp_path / f'then-{fraction}.db'}")
        migrate(then)
        apply_shuffled(then, [e for e in events if e.ts <= at], seed=2)
        rebuilt = rebuild_at(engine, "default", at)
        expected = store_jobs(then)
        assert expected, "the window holds jobs"
        states = {s for s in (j["state"] for j in expected.values())}
        assert {"running", "completed"} <= states  # mid-replay: some running, some done
        got = {
            job_id: {c: utc(getattr(j, c)) if c.endswith("_at") else getattr(j, c) for c in COMPARED}
            for job_id, j in rebuilt.jobs.items()
        }
        assert got.keys() == expected.keys()
        for job_id, fields in expected.items():
            assert got[job_id] == fields, job_id
        with Session(then) as session:
            nodes = {n.node_id: n.status for n in session.exec(select(Node)).all()}
        assert {n.node_id: n.status for n in rebuilt.nodes} == nodes
        then.dispose()


def test_the_version_in_use_at_t_never_knows_what_came_after(registry_copy: Path) -> None:
    registry = ModelRegistry(registry_copy)
    first = registry.in_use()
    assert first is not None
    models = registry.load(first)
    put_in_use = datetime.now(UTC)
    later = put_in_use + timedelta(days=30)
    # A refit on observed runs up to `later` is put in use now: it knows the telemetry up to `later`.
    knowing = registry.save(models, {"data": {"observed_through": later.isoformat()}}, [])
    registry.promote(knowing, reason="test")
    assert registry.in_use() == knowing
    assert registry.version_in_use_at(put_in_use - timedelta(days=3650)) is None  # before any was in use
    assert registry.version_in_use_at(later - timedelta(hours=1)) == first  # the refit knew later data
    assert registry.version_in_use_at(later + timedelta(hours=1)) == knowing
    # Rolled back, the first one is the one in use again from then on.
    registry.rollback(reason="test")
    assert registry.version_in_use_at(later + timedelta(hours=1)) == first


def test_finetwin_backtest_from_store(
    registry_copy: Path,
    sample_rows: pd.DataFrame,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from finetwin.cli import main

    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    migrate(engine)
    epoch = datetime.now(UTC) + timedelta(minutes=5)  # like `up`: the replay starts after the first model
    plan = plan_replay(sample_rows, seed=0, epoch=epoch)
    apply_shuffled(engine, [e for _, e in plan.events], seed=4)
    engine.dispose()
    monkeypatch.setenv("FINETWIN_DATABASE_URL", url)
    at = epoch + timedelta(seconds=plan.duration_s / 3)
    argv = ["backtest", "--from-store", "--at", at.isoformat(), "--horizon", "2h", "--runs", "4",
            "--models", str(registry_copy), "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["at"] == at.isoformat() and doc["horizon_s"] == 7200.0
    assert set(doc["figures"]) == {"jobs_completed", "gpu_hours", "wait_mean_s", "makespan_s", "energy_kwh"}
    assert doc["figures"]["gpu_hours"]["truth"] > 0 and doc["figures"]["energy_kwh"]["truth"] > 0
    assert doc["jobs_at_start"]["running"] > 0 and doc["jobs_in_window"] > doc["jobs_at_start"]["running"]
    assert "v0001" in doc["models"]
    # Persistence: the window before, [T - H, T], measured as the truth is. Here it starts before the
    # telemetry's first event: none, said, not made up.
    assert all(f["persistence"] == {"value": None, "error": None} for f in doc["figures"].values())
    # Mid-replay it is the truth of a backtest at T - H, figure by figure, with its error against the truth.
    mid = epoch + timedelta(seconds=plan.duration_s / 2)

    def at_json(when: datetime) -> dict:
        argv = ["backtest", "--from-store", "--at", when.isoformat(), "--horizon", "1h", "--runs", "2",
                "--models", str(registry_copy), "--json"]  # fmt: skip
        assert main(argv) == 0
        return json.loads(capsys.readouterr().out)["figures"]

    now, prior = at_json(mid), at_json(mid - timedelta(hours=1))
    for name, figure in now.items():
        previous, truth = figure["persistence"], figure["truth"]
        assert previous["value"] == pytest.approx(prior[name]["truth"]), name
        expected = pytest.approx((previous["value"] - truth) / truth) if truth else None
        assert previous["error"] == expected, name
    assert now["jobs_completed"]["persistence"]["value"] > 0
    table_argv = ["backtest", "--from-store", "--at", mid.isoformat(), "--horizon", "1h", "--runs", "2",
                  "--models", str(registry_copy)]  # fmt: skip
    assert main(table_argv) == 0
    table = capsys.readouterr().out
    assert "its error" in table and "the window before T, [T - H, T]" in table
    row = next(line.split() for line in table.splitlines() if line.startswith("jobs_completed"))
    assert row[-2] == f"{now['jobs_completed']['persistence']['value']:g}", row
    # T before the store's telemetry: refused with the span it holds (checked before the models).
    assert main(["backtest", "--from-store", "--at", "2020-01-01T00:00:00Z", "--horizon", "2h"]) == 2
    assert "before any telemetry" in capsys.readouterr().err  # the store's span is checked first
    assert main(["backtest", "--from-store", "--at", at.isoformat()]) == 2
    err = " ".join(capsys.readouterr().err.split())  # the console wraps long lines
    assert "--horizon" in err and "the store's telemetry of cluster 'default' runs from" in err
    # A window past the newest telemetry has no truth yet: refused, with what the store holds, not scored
    # against nothing (it read "0 jobs completed").
    last = epoch + timedelta(seconds=plan.duration_s)
    late = ["backtest", "--from-store", "--at", (last - timedelta(hours=1)).isoformat(), "--horizon", "2h",
            "--models", str(registry_copy)]  # fmt: skip
    assert main(late) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is after the newest telemetry" in err and "not in the store yet" in err
    # T as a duration back from the newest telemetry, as --since takes one: "3 hours ago" on the replay clock,
    # hours ahead of the wall's (an RFC 3339 time was the only way to say it).
    back = ["backtest", "--from-store", "--at", "3h", "--horizon", "2h", "--runs", "2",
            "--models", str(registry_copy), "--json"]  # fmt: skip
    assert main(back) == 0
    assert json.loads(capsys.readouterr().out)["at"] == (last - timedelta(hours=3)).isoformat()
    assert main(["backtest", "--from-store", "--at", "last tuesday", "--horizon", "2h"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--at: not an RFC 3339 time or a duration back from the newest telemetry (e.g. 6h)" in err
    # A window past the calendar's end was an OverflowError traceback.
    endless = ["backtest", "--from-store", "--at", at.isoformat(), "--horizon", "99999999d"]
    assert main(endless) == 2
    assert "--horizon: at most 3,653 days (ten years)" in capsys.readouterr().err
    assert main(["backtest", "--from-store", "--at", "9999-12-29T23:00:00Z", "--horizon", "3d"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ends past the year 9999" in err and "the store's telemetry of cluster 'default' runs from" in err
    # Telemetry from before any model version was in use: nothing honest to forecast it with. The error says
    # from when backtests can start.
    first = ModelRegistry(registry_copy).first_put_in_use()
    assert first is not None
    old_url = f"sqlite:///{tmp_path / 'old.db'}"
    old = make_engine(old_url)
    migrate(old)
    old_plan = plan_replay(sample_rows, seed=0, epoch=first - timedelta(days=2))
    apply_events(old, [e for _, e in old_plan.events])
    old.dispose()
    monkeypatch.setenv("FINETWIN_DATABASE_URL", old_url)
    old_at = (old_plan.epoch + timedelta(seconds=old_plan.duration_s / 3)).isoformat()
    before_models = ["backtest", "--from-store", "--at", old_at, "--horizon", "1h", "--models"]
    assert main([*before_models, str(registry_copy)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"no model version was in use at {old_at}" in err and first.isoformat() in err
    # An empty registry: what to run first.
    assert main([*before_models, str(tmp_path / "no-models")]) == 2
    assert "run `finetwin calibrate` first" in " ".join(capsys.readouterr().err.split())


def test_a_window_the_telemetry_does_not_cover_is_refused_with_its_span(tmp_path: Path) -> None:
    from ingest.events import NodeStatus, new_event
    from twin.store_backtest import backtest_from_store, check_window

    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="holds no telemetry of cluster 'default'"):
        backtest_from_store(engine, None, at=t0, horizon_s=3600.0)
    up = NodeStatus(node_id="a100-0", gpu_model="NVIDIA-A100-SXM4-80GB", gpu_count=8, status="up")
    hourly = [new_event("node.status", up, job_id=None, ts=t0 + timedelta(hours=k)) for k in range(4)]
    apply_events(engine, hourly)
    span = re.escape("runs from 2026-03-01T00:00:00+00:00 to 2026-03-01T03:00:00+00:00")
    with pytest.raises(ValueError, match=f"is before any telemetry: .*{span}"):
        check_window(engine, "default", t0 - timedelta(minutes=1), t0 + timedelta(hours=1))
    with pytest.raises(ValueError, match=f"is after the newest telemetry.*{span}"):
        check_window(engine, "default", t0 + timedelta(hours=2), t0 + timedelta(hours=3, seconds=1))
    check_window(engine, "default", t0, t0 + timedelta(hours=3))  # the whole span: covered


WEEK = timedelta(days=7)


def full_fold_states(
    engine: Engine, cluster_id: str, at: datetime, end: datetime, lookback: timedelta
) -> BacktestStates:
    """The reference: every event up to `end` folded, as a backtest read the store before its read was
    bounded to its window."""
    events = stored_events(engine, cluster_id, end)
    before, after = fold_events(events, cluster_id, at), fold_events(events, cluster_id, end)
    earliest = min((j.submitted_at for j in after.jobs.values() if j.submitted_at is not None), default=at)
    return BacktestStates(max(at - lookback, min(earliest, at)), before, after)


def fields(job: JobRecord) -> dict[str, object]:
    return {c: utc(getattr(job, c)) if c.endswith("_at") else getattr(job, c) for c in COMPARED}


def assert_same_backtest_start(
    got: BacktestStates, want: BacktestStates, at: datetime, end: datetime
) -> None:
    """Everything a backtest reads of the two states: the window, the jobs open at T and the window's
    history with their work, the nodes, the failure times, and the jobs it scores at `end`."""
    assert got.since == want.since
    got_rows, want_rows = got.before.rows(got.since), want.before.rows(want.since)
    for part in ("active", "history"):
        got_jobs = {j.job_id: fields(j) for j in getattr(got_rows, part)}
        assert got_jobs == {j.job_id: fields(j) for j in getattr(want_rows, part)}, part
    read = {j.job_id for j in got_rows.active + got_rows.history}
    assert {k: v for k, v in got_rows.observed_work.items() if k in read} == {
        k: v for k, v in want_rows.observed_work.items() if k in read
    }
    for state in ("before", "after"):
        assert [(n.node_id, n.status, n.gpu_count) for n in getattr(got, state).nodes] == [
            (n.node_id, n.status, n.gpu_count) for n in getattr(want, state).nodes
        ], state
    assert got_rows.failures == want_rows.failures
    scored = read | {
        j.job_id for j in want.after.jobs.values() if j.submitted_at and at < j.submitted_at <= end
    }
    assert {j: fields(got.after.jobs[j]) for j in scored} == {j: fields(want.after.jobs[j]) for j in scored}
    assert {j: got.after.observed_power_w.get(j) for j in scored} == {
        j: want.after.observed_power_w.get(j) for j in scored
    }


def test_a_backtest_reads_only_its_window_and_starts_where_the_whole_record_folded_starts(
    engine: Engine, sample_rows: pd.DataFrame
) -> None:
    epoch = datetime(2025, 5, 1, tzinfo=UTC)
    plan = plan_replay(sample_rows, seed=3, epoch=epoch)
    events = [e for _, e in plan.events]
    # Older than every window below: a node that went down at the start (its last report is long before
    # T), and a job queued at the start and rejected late (open at the first T, submitted long before).
    node_id, gpu = next(iter(plan.nodes.items()))
    down = NodeStatus(node_id=node_id, gpu_model=gpu, gpu_count=8, status="down")
    events.append(new_event("node.status", down, job_id=None, ts=epoch + timedelta(seconds=30)))
    config = next(e for e in events if e.type == "job.submitted").payload
    events.append(new_event("job.submitted", config, job_id="long-queued", ts=epoch + timedelta(seconds=2)))
    rejected_at = epoch + timedelta(seconds=plan.duration_s * 0.6)
    events.append(
        new_event(
            "job.rejected",
            JobRejected(rule=Rule.GPUS_NOT_MULTIPLE_OF_NODES),
            job_id="long-queued",
            ts=rejected_at,
        )
    )
    # A clock-skewed job: completed a minute after the start, its start reported as late in the record.
    events.append(new_event("job.submitted", config, job_id="skewed", ts=epoch + timedelta(seconds=3)))
    events.append(next(e for e in events if e.type == "job.completed").model_copy(
        update={"job_id": "skewed", "ts": epoch + timedelta(seconds=60), "event_id": uuid.uuid4()}
    ))  # fmt: skip
    late = epoch + timedelta(seconds=plan.duration_s * 0.75)
    events.append(new_event("job.started", JobStarted(node_ids=[node_id]), job_id="skewed", ts=late))
    lookback, horizon = timedelta(minutes=30), timedelta(hours=1)
    first_at = epoch + timedelta(seconds=plan.duration_s * 0.4)
    # The other nodes report every 10 minutes (heartbeats); one of them goes down in the first window and
    # comes back an hour after it.
    flapping = list(plan.nodes)[1]
    for other, other_gpu in list(plan.nodes.items())[1:]:
        for minute in range(1, int(plan.duration_s // 60), 10):
            ts = epoch + timedelta(minutes=minute)
            down_now = other == flapping and first_at + horizon / 2 <= ts < first_at + 2 * horizon
            report = NodeStatus(
                node_id=other, gpu_model=other_gpu, gpu_count=8, status="down" if down_now else "up"
            )
            events.append(new_event("node.status", report, job_id=None, ts=ts))
    apply_shuffled(engine, events, seed=5)

    got = backtest_states(engine, "default", first_at, first_at + horizon, lookback)
    want = full_fold_states(engine, "default", first_at, first_at + horizon, lookback)
    assert "long-queued" in {j.job_id for j in got.before.rows(got.since).active}
    assert node_id not in {n.node_id for n in got.before.nodes if n.status == "up"}
    assert {n.node_id: n.status for n in got.after.nodes}[flapping] == "down"
    assert_same_backtest_start(got, want, first_at, first_at + horizon)

    # Later, with the long-queued job ended: no job event dated before the window (or before the start of a
    # job still open at T) is needed. Deleted from the store, the backtest starts from the same state as the
    # whole record gave.
    at = epoch + timedelta(seconds=plan.duration_s * 0.8)
    want = full_fold_states(engine, "default", at, at + horizon, lookback)
    open_at_t = want.before.rows(want.since).active
    assert open_at_t and not any(j.job_id == "long-queued" for j in open_at_t)
    cut = min([want.since, *(t for j in open_at_t for t in (j.submitted_at, j.started_at) if t)])
    older = [j for j in want.before.jobs.values() if j.submitted_at and j.submitted_at < cut]
    assert len(older) > len(want.before.rows(want.since).history)  # the window is a small part
    with engine.begin() as connection:
        pruned = connection.execute(
            delete(TelemetryEvent).where(
                col(TelemetryEvent.ts) < cut, col(TelemetryEvent.type) != "node.status"
            )
        ).rowcount
    assert pruned > 0
    assert_same_backtest_start(
        backtest_states(engine, "default", at, at + horizon, lookback), want, at, at + horizon
    )


def test_sqlite_finds_the_nodes_older_reports_in_their_own_index(tmp_path: Path) -> None:
    """The nodes' state before the window, from the reports that changed something (a node's heartbeats
    would make the read grow with the record), by their index."""
    engine = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    migrate(engine)
    at = datetime(2025, 5, 1, tzinfo=UTC)
    end = at + timedelta(hours=1)
    plans = sqlite_plans(engine, lambda: backtest_states(engine, "default", at, end, WEEK))
    (node_plan,) = [plan for statement, plan in plans.items() if "node_status_changes" in statement]
    assert "ix_node_status_changes_cluster_ts" in node_plan
    assert not any("node.status" in statement for statement in plans)
    engine.dispose()
