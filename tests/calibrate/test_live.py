"""Live predictions and live error through the real ingest path (`ingest.apply.apply_events` with the
calibrate hook), on SQLite and PostgreSQL; drift of the live error triggers a refit, driven by events."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, select
from sqlmodel import Session

from calibrate.drift import DriftPolicy, drift, summarize
from calibrate.live_error import prediction_hook
from calibrate.observed import observed_table, observed_weights
from calibrate.records import JobPrediction, LiveError, ModelVersionRecord
from calibrate.refit import REFIT_NOW_JOB_ID, RefitResult, RefitScheduler, _ProcessPerTask
from calibrate.registry import ModelRegistry
from finetwin.schema import migrate
from finetwin.settings import Settings
from ingest.apply import apply_events
from ingest.events import JobCompleted, JobFailed, JobRejected, JobSubmitted, new_event
from twin.db import make_engine

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
FITS = dict(model_name="llama3-8b", method="lora", gpu_model="NVIDIA-A100-SXM4-80GB", number_gpus=2,
            number_nodes=1, batch_size=8, tokens_per_sample=1024)  # fmt: skip


def submitted(job_id: str, **changes: Any) -> Any:
    return new_event("job.submitted", JobSubmitted(**{**FITS, **changes}), job_id=job_id, ts=T0)


def completed(job_id: str, tokens_per_second: float, minutes: int = 10) -> Any:
    payload = JobCompleted(train_runtime=600.0, dataset_tokens_per_second=tokens_per_second)
    return new_event("job.completed", payload, job_id=job_id, ts=T0 + timedelta(minutes=minutes))


def failed(job_id: str, reason: str = "oom") -> Any:
    return new_event("job.failed", JobFailed(reason=reason, seconds_into_run=30.0), job_id=job_id, ts=T0)


def predictions(engine: Engine) -> dict[str, JobPrediction]:
    with Session(engine) as session:
        return {p.job_id: p for p in session.exec(select(JobPrediction)).scalars()}


def live_errors(engine: Engine) -> dict[str, LiveError]:
    with Session(engine) as session:
        return {e.job_id: e for e in session.exec(select(LiveError)).scalars()}


@pytest.mark.integration
def test_predictions_are_stored_at_submission_and_live_error_at_the_end(
    engine: Engine, registry_copy: Path
) -> None:
    hook = prediction_hook(Settings(), models_dir=registry_copy)
    batch = [
        submitted("ok"),
        submitted("rejected", batch_size=7),  # 2 GPUs do not divide 7
        submitted(
            "oom",
            model_name="llama3-70b",
            method="full",
            number_gpus=1,
            batch_size=16,
            tokens_per_sample=8192,
        ),  # fmt: skip
        submitted("other"),
    ]
    assert apply_events(engine, batch, [hook]).applied == 4
    stored = predictions(engine)
    assert set(stored) == {"ok", "rejected", "oom", "other"}
    assert {p.model_version for p in stored.values()} == {"v0001"}
    ok = stored["ok"]
    assert ok.outcome == "valid" and ok.rule is None and ok.p_valid >= 0.5
    assert 0 < ok.tokens_per_second_p10 <= ok.tokens_per_second_p50 <= ok.tokens_per_second_p90
    assert stored["rejected"].outcome == "rejected"
    assert stored["rejected"].rule == "batch_size_not_multiple_of_gpus"
    assert stored["oom"].p_valid < ok.p_valid, "70B full fine-tuning on one GPU is far likelier to run out"
    with Session(engine) as session:
        assert session.get(ModelVersionRecord, "v0001") is not None, "the store learns the version"

    measured = ok.tokens_per_second_p50 * 1.25
    ended = [
        completed("ok", measured),
        new_event(
            "job.rejected", JobRejected(rule="batch_size_not_multiple_of_gpus"), job_id="rejected", ts=T0
        ),
        failed("oom"),
        failed("other", reason="other"),  # not a memory failure: not scored
    ]
    assert apply_events(engine, ended, [hook]).applied == 4
    errors = live_errors(engine)
    assert set(errors) == {"ok", "rejected", "oom"}
    assert errors["ok"].ape == pytest.approx(abs(ok.tokens_per_second_p50 - measured) / measured)
    assert errors["ok"].actual_outcome == "valid" and errors["ok"].outcome_error == 0
    assert errors["ok"].measured_tokens_per_second == pytest.approx(measured)
    assert errors["rejected"].outcome_error == 0 and errors["rejected"].ape is None
    assert errors["oom"].actual_outcome == "runtime"
    assert errors["oom"].outcome_error == int(stored["oom"].outcome != "runtime")
    assert errors["oom"].failure_brier == pytest.approx(stored["oom"].p_valid ** 2)

    # Redelivered events change nothing (ingest skips them; the hook would too).
    assert apply_events(engine, [*batch, *ended], [hook]).applied == 0
    hook(engine.connect(), [submitted("ok")])  # even if called again directly: one prediction per job
    assert len(predictions(engine)) == 4 and len(live_errors(engine)) == 3


def test_a_job_that_ended_before_its_submission_arrived_still_gets_its_live_error(
    sqlite_url: str, registry_copy: Path
) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    hook = prediction_hook(Settings(), models_dir=registry_copy)
    apply_events(engine, [completed("late", 1234.0)], [hook])
    assert live_errors(engine) == {}
    apply_events(engine, [submitted("late")], [hook])
    error = live_errors(engine)["late"]
    assert error.measured_tokens_per_second == pytest.approx(1234.0)
    assert error.ape == pytest.approx(
        abs(predictions(engine)["late"].tokens_per_second_p50 - 1234.0) / 1234.0
    )
    engine.dispose()


def test_the_hook_follows_the_version_in_use_and_skips_when_there_is_none(
    sqlite_url: str, registry_copy: Path, tmp_path: Path
) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    nothing = prediction_hook(Settings(), models_dir=tmp_path / "no-models")
    apply_events(engine, [submitted("before")], [nothing])
    assert predictions(engine) == {}, "no model in use: nothing stored, ingest goes on"

    hook = prediction_hook(Settings(), models_dir=registry_copy)
    apply_events(engine, [submitted("a")], [hook])
    registry = ModelRegistry(registry_copy)
    registry.promote(registry.save(registry.load("v0001"), registry.metadata("v0001"), []), reason="test")
    apply_events(engine, [submitted("b")], [hook])
    assert predictions(engine)["a"].model_version == "v0001"
    assert predictions(engine)["b"].model_version == "v0002", "reloaded when the pointer changed"

    artifact = sorted((registry.path("v0002") / "estimators").glob("*.skops"))[0]
    artifact.write_bytes(b"tampered")
    restarted = prediction_hook(Settings(), models_dir=registry_copy)  # a new worker loads what is in use
    apply_events(engine, [submitted("c"), completed("a", 100.0)], [restarted])
    assert "c" not in predictions(engine), "a model that fails verification predicts nothing"
    assert "a" in live_errors(engine), "and the rest of the batch is applied"
    engine.dispose()


@pytest.mark.slow
def test_drift_in_the_live_error_triggers_a_refit(
    sqlite_url: str, registry_copy: Path, sample_csv: Path
) -> None:

    engine = make_engine(sqlite_url)
    migrate(engine)
    subset = registry_copy.parent / "subset.csv"
    lines = sample_csv.read_text().splitlines(keepends=True)
    subset.write_text("".join([lines[0], *lines[1::10]]))
    settings = Settings(
        drift_window=10, drift_min_jobs=5, drift_mdape_threshold=0.25, refit_benchmarks=[subset],
        models_dir=registry_copy,
    )  # fmt: skip
    done = threading.Event()
    results: list[RefitResult] = []

    def finished(result: RefitResult) -> None:
        results.append(result)
        done.set()

    scheduler = BackgroundScheduler(timezone="UTC")
    refits = RefitScheduler(settings, engine, scheduler, on_done=finished)
    hook = prediction_hook(settings, on_drift=refits.on_drift)
    scheduler.start()
    try:
        jobs = [f"job-{i}" for i in range(6)]
        apply_events(engine, [submitted(j, batch_size=8 * (1 + i % 3)) for i, j in enumerate(jobs)], [hook])
        p50 = {j: p.tokens_per_second_p50 for j, p in predictions(engine).items()}
        # The cluster runs at half the predicted speed: APE 100 % on each completed job.
        for i, job in enumerate(jobs[:4]):
            apply_events(engine, [completed(job, p50[job] / 2, minutes=i)], [hook])
        assert not done.is_set() and scheduler.get_job(REFIT_NOW_JOB_ID) is None, "4 jobs are too few to say"
        apply_events(engine, [completed(jobs[4], p50[jobs[4]] / 2)], [hook])  # the 5th crosses min_jobs
        assert done.wait(timeout=300), "the drift refit did not finish"
    finally:
        scheduler.shutdown(wait=True)
    (result,) = results
    assert result.error is None, result.message
    assert result.version == "v0002"
    metadata = ModelRegistry(registry_copy).metadata("v0002")
    assert metadata["reason"].startswith("drift: live error of v0001 drifted: throughput MdAPE 100.0%")
    assert metadata["data"]["rows_by_source"] == {"benchmark:subset.csv": len(lines[1::10]), "observed": 5}
    assert metadata["comparison"]["against"] == "v0001"
    with engine.connect() as connection:
        summary = summarize(connection, "v0001", 10)
    assert summary.jobs == 5 and summary.mdape == pytest.approx(1.0)
    engine.dispose()


def test_the_periodic_check_finds_drift_from_another_process_and_respects_the_cooldown(
    sqlite_url: str, registry_copy: Path
) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    settings = Settings(drift_window=10, drift_min_jobs=3, drift_failure_error_threshold=0.5)
    hook = prediction_hook(settings, models_dir=registry_copy)  # no callback: as in a separate ingest process
    jobs = [f"j{i}" for i in range(3)]
    apply_events(engine, [submitted(j) for j in jobs], [hook])
    assert all(p.outcome == "valid" for p in predictions(engine).values())
    apply_events(engine, [failed(j) for j in jobs], [hook])  # predicted to run, all ran out of memory

    class RecordingScheduler:  # unit-test stand-in for apscheduler: records what would run
        def __init__(self) -> None:
            self.jobs: list[dict[str, Any]] = []

        def add_job(self, func: Any, trigger: Any = None, **kwargs: Any) -> None:
            self.jobs.append({"func": func, "trigger": trigger, **kwargs})

    now = [T0]
    scheduler = RecordingScheduler()
    refits = RefitScheduler(settings, engine, scheduler, models_dir=registry_copy, clock=lambda: now[0])
    refits.install()
    assert [j["id"] for j in scheduler.jobs] == ["calibrate.refit", "calibrate.drift-check"]
    assert scheduler.jobs[0]["minutes"] == 60 and scheduler.jobs[0]["trigger"] == "interval"
    assert refits.check_drift() is True
    refit_now = scheduler.jobs[-1]
    assert refit_now["id"] == REFIT_NOW_JOB_ID and refit_now["next_run_time"] == T0
    assert "outcome error 100.0% over the last 3 finished jobs" in refit_now["kwargs"]["reason"]
    now[0] = T0 + timedelta(minutes=10)
    assert refits.check_drift() is False, "within the cooldown"
    now[0] = T0 + timedelta(minutes=31)
    assert refits.check_drift() is True
    with engine.connect() as connection:
        assert drift(summarize(connection, "v0001", 10), DriftPolicy(min_jobs=4)) is None, "too few jobs"
    engine.dispose()


def test_observed_runs_become_benchmark_rows_that_weigh_more_when_newer(
    sqlite_url: str, registry_copy: Path
) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    events = [
        submitted("ran", fast_kernels=True, time_limit_s=600.0),
        completed("ran", 1500.0),
        submitted("oom"),
        failed("oom"),
        submitted("crashed"),
        failed("crashed", reason="other"),  # not a memory failure: nothing to learn
        submitted("rejected", batch_size=7),
        new_event(
            "job.rejected", JobRejected(rule="batch_size_not_multiple_of_gpus"), job_id="rejected", ts=T0
        ),
        submitted("running"),  # not finished
        completed("unknown-config", 99.0),  # its job.submitted never came
    ]
    apply_events(engine, events, [])
    table = observed_table(engine).set_index("job_id")
    assert sorted(table.index) == ["oom", "ran", "rejected"]
    assert list(table["outcome"]) == ["runtime", "valid", "rejected"]
    ran = table.loc["ran"]
    assert ran["dataset_tokens_per_second"] == 1500.0 and ran["train_runtime"] == 600.0
    assert ran["is_valid"] == 1 and bool(ran["fast_kernels"]) and ran["time_limit_s"] == 600.0
    assert ran["dataset_tokens_per_second_per_gpu"] == 750.0 and ran["source"] == "observed"
    assert table.loc["rejected", "rule"] == "batch_size_not_multiple_of_gpus"
    assert np.isnan(table.loc["oom", "dataset_tokens_per_second"])

    now = T0 + timedelta(days=60)
    ages = pd.Series([now, now - timedelta(days=30), now - timedelta(days=365)])
    weights = observed_weights(ages, now, weight=5.0, half_life_days=30.0)
    np.testing.assert_allclose(weights[:2], [5.0, 3.0])  # the extra weight (4) halves in a half-life
    assert 1.0 < weights[2] < 1.01, "an old observed run still counts at least as much as a benchmark row"
    engine.dispose()


def test_the_hourly_refit_does_nothing_without_new_rows(sqlite_url: str, registry_copy: Path) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    # No benchmark configured: the refit learns from the in-use version's file again, plus observed runs
    # (none yet), so it would fit the very same rows.
    settings = Settings(refit_observed=True, models_dir=registry_copy)
    result = RefitScheduler(settings, engine, scheduler=None).refit(reason="schedule")
    assert result is not None and result.error is None, result
    assert result.version is None and result.message.startswith("nothing new since v0001 (same 3983 rows)")
    assert ModelRegistry(registry_copy).versions() == ["v0001"]
    engine.dispose()


def test_a_fresh_installation_fits_its_first_model_at_once(sqlite_url: str, tmp_path: Path) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    scheduler = BackgroundScheduler(timezone="UTC")  # not started: we only look at what it would run
    refits = RefitScheduler(Settings(), engine, scheduler, models_dir=tmp_path / "empty", clock=lambda: T0)
    refits.install()
    first = scheduler.get_job(REFIT_NOW_JOB_ID)
    assert first is not None and first.kwargs == {"reason": "first model"}
    engine.dispose()


def test_an_installation_with_a_model_waits_for_the_schedule(sqlite_url: str, registry_copy: Path) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    scheduler = BackgroundScheduler(timezone="UTC")
    RefitScheduler(Settings(), engine, scheduler, models_dir=registry_copy, clock=lambda: T0).install()
    assert scheduler.get_job(REFIT_NOW_JOB_ID) is None
    engine.dispose()


def _interrupt_this_worker() -> None:
    os.kill(os.getpid(), signal.SIGINT)  # a terminal's Ctrl-C reaching the comparison fit's worker
    time.sleep(10)  # never reached: the KeyboardInterrupt is raised at once


def _calibrate_in_an_interrupted_worker(*_args: Any, **_kwargs: Any) -> None:
    with _ProcessPerTask(warm=0) as worker:
        worker.submit(_interrupt_this_worker).result()


def test_a_refit_whose_worker_takes_ctrl_c_is_abandoned_quietly(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    ctrl_c_raises: None,
) -> None:  # fmt: skip
    """`finetwin up` stopping mid-calibration: the worker's KeyboardInterrupt comes back as its result, in
    the scheduler's thread; the refit says it was abandoned (no traceback) and frees its lock."""
    engine = make_engine(sqlite_url)
    migrate(engine)
    models = tmp_path / "models"  # in this process: the patched calibration is this process's
    refits = RefitScheduler(Settings(), engine, scheduler=None, models_dir=models, in_child=False)
    monkeypatch.setattr("calibrate.refit.calibrate_version", _calibrate_in_an_interrupted_worker)
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(refits.refit(reason="first model")))
    with caplog.at_level("INFO", logger="calibrate.refit"):
        thread.start()
        thread.join()
    assert outcome == [None]
    assert "refit (first model) abandoned: its worker process was interrupted" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info]
    assert refits._running.acquire(blocking=False)  # released: the next refit can run
    # In the main thread a KeyboardInterrupt is the user's own Ctrl-C: it is not swallowed.
    refits._running.release()
    with pytest.raises(KeyboardInterrupt):
        refits.refit(reason="schedule")
    engine.dispose()
