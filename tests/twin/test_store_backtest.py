"""Backtest from the store: the state at T rebuilt from the stored events equals what the store held at T,
job by job, whatever order the events were delivered in; the backtest uses the model version in use at T and
never one fitted on what came after."""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from sqlalchemy import Engine
from sqlmodel import Session, select

from calibrate.loader import load_benchmark
from calibrate.registry import ModelRegistry
from finetwin.schema import migrate
from ingest.apply import apply_events
from ingest.replay import plan_replay
from twin.db import make_engine
from twin.rebuild import rebuild_at
from twin.store import Job, Node

COMPARED = (
    "state", "outcome", "submitted_at", "started_at", "ended_at", "node_ids", "tokens_processed",
    "last_tokens_per_second", "last_power_watts", "failed_after_s", "rule", "model_name", "method",
    "gpu_model", "number_gpus", "batch_size", "dataset_tokens", "experiment_id",
)  # fmt: skip


def apply_shuffled(engine: Engine, events: list, seed: int) -> None:
    """Delivered out of order, in batches of random size, each event once or twice (at least once)."""
    rng = random.Random(seed)
    shuffled = events + rng.sample(events, len(events) // 5)
    rng.shuffle(shuffled)
    while shuffled:
        size = rng.randint(1, 40)
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
    # Before any model version was in use there is nothing honest to backtest with: a clear error.
    before_models = ["backtest", "--from-store", "--at", "2020-01-01T00:00:00Z", "--horizon", "2h",
                     "--models", str(registry_copy)]  # fmt: skip
    assert main(before_models) == 2
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
    # A window past the calendar's end was an OverflowError traceback.
    endless = ["backtest", "--from-store", "--at", at.isoformat(), "--horizon", "99999999d"]
    assert main(endless) == 2
    assert "--horizon: at most 3,653 days (ten years)" in capsys.readouterr().err
    assert main(["backtest", "--from-store", "--at", "9999-12-31T23:00:00Z", "--horizon", "2h"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ends past the year 9999" in err and "the store's telemetry of cluster 'default' runs from" in err


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
