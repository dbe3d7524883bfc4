"""Applying events to the store, on SQLite and PostgreSQL: each event_id once, out of order, duplicates."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from sqlalchemy import Connection, Engine, select, text
from sqlalchemy.exc import DataError

from ingest.apply import ConflictingEvent, apply_events
from ingest.events import (
    Event,
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeStatus,
    new_event,
)
from ingest.replay import plan_replay
from tests.conftest import wait_for
from tests.ingest.conftest import assert_store_matches_benchmark, store_count
from twin.domain import Rule
from twin.store import Job, Node, ObservedRun

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
SUBMITTED = JobSubmitted(
    model_name="llama3-8b", method="lora", gpu_model="NVIDIA-A100-SXM4-80GB", number_gpus=4, number_nodes=1,
    batch_size=16, tokens_per_sample=2048, fast_kernels=True, dataset_tokens=1.2e7, tenant="team-a",
)  # fmt: skip
COMPLETED = JobCompleted(train_runtime=600.0, dataset_tokens_per_second=20000.0, gpu_power_watts_avg=310.5)


def progress(tokens: float) -> JobProgress:
    return JobProgress(tokens_processed=tokens, tokens_per_second=2e4)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def lifecycle(job_id: str) -> list[Event]:
    return [
        new_event("job.submitted", SUBMITTED, job_id=job_id, ts=at(0)),
        new_event("job.started", JobStarted(node_ids=["a100-sxm-00"]), job_id=job_id, ts=at(1)),
        new_event("job.progress", progress(4e6), job_id=job_id, ts=at(4)),
        new_event("job.progress", progress(8e6), job_id=job_id, ts=at(7)),
        new_event("job.completed", COMPLETED, job_id=job_id, ts=at(11)),
    ]  # fmt: skip


def job(engine: Engine, job_id: str) -> Job:
    with engine.connect() as connection:
        return connection.execute(select(Job).where(Job.job_id == job_id)).one()


def observed(engine: Engine, job_id: str) -> ObservedRun | None:
    with engine.connect() as connection:
        return connection.execute(select(ObservedRun).where(ObservedRun.job_id == job_id)).one_or_none()


def test_in_order_lifecycle_fills_the_job_and_its_observed_run(engine: Engine) -> None:
    result = apply_events(engine, lifecycle("j1"))
    assert (result.applied, result.duplicates) == (5, 0)
    row = job(engine, "j1")
    assert (row.state, row.outcome) == ("completed", "valid")
    assert (row.model_name, row.number_gpus, row.batch_size, row.fast_kernels, row.tenant) == (
        "llama3-8b", 4, 16, True, "team-a",
    )  # fmt: skip
    assert row.tokens_processed == 8e6 and row.node_ids == ["a100-sxm-00"]
    run = observed(engine, "j1")
    assert run is not None and run.is_valid == 1
    assert (run.train_runtime, run.dataset_tokens_per_second, run.gpu_power_watts_avg) == (
        600.0,
        20000.0,
        310.5,
    )


def test_redelivered_events_are_applied_once(engine: Engine) -> None:
    events = lifecycle("j2")
    apply_events(engine, events[:3])
    again = apply_events(engine, events)  # a redelivered batch overlapping the first
    assert (again.applied, again.duplicates) == (2, 3)
    assert [e.event_id for e in again.applied_events] == [e.event_id for e in events[3:]]
    assert apply_events(engine, events).applied == 0
    assert store_count(engine) == 5


def test_duplicates_inside_one_batch_count_once(engine: Engine) -> None:
    events = lifecycle("j3")
    result = apply_events(engine, events + events[::-1] + events[1:2])
    assert (result.applied, result.duplicates) == (5, 6)
    assert store_count(engine) == 5


@pytest.mark.parametrize("one_batch", [True, False], ids=["one-batch", "batch-per-event"])
def test_out_of_order_events_end_where_the_job_ended(engine: Engine, one_batch: bool) -> None:
    events = lifecycle("j4")
    shuffled = [events[4], events[2], events[1], events[3], events[0]]  # completion first, submission last
    if one_batch:
        apply_events(engine, shuffled)
    else:
        for event in shuffled:
            apply_events(engine, [event])
    row = job(engine, "j4")
    assert (row.state, row.outcome) == ("completed", "valid")
    assert row.model_name == "llama3-8b" and row.dataset_tokens == 1.2e7  # filled in when submitted came
    assert row.tokens_processed == 8e6  # the later report, though it arrived first
    assert (
        _aware(row.submitted_at) == at(0)
        and _aware(row.started_at) == at(1)
        and _aware(row.ended_at) == at(11)
    )
    assert observed(engine, "j4").is_valid == 1  # type: ignore[union-attr]


def test_a_late_start_never_moves_a_finished_job_back(engine: Engine) -> None:
    apply_events(
        engine,
        [new_event("job.failed", JobFailed(reason="oom", seconds_into_run=42.0), job_id="j5", ts=at(3))],
    )
    row = job(engine, "j5")
    assert (row.state, row.outcome, row.failure_reason, row.failed_after_s) == (
        "failed",
        "runtime",
        "oom",
        42.0,
    )
    apply_events(engine, [new_event("job.started", JobStarted(node_ids=["n1"]), job_id="j5", ts=at(1))])
    apply_events(engine, [new_event("job.submitted", SUBMITTED, job_id="j5", ts=at(0))])
    row = job(engine, "j5")
    assert (row.state, row.outcome) == ("failed", "runtime")
    assert row.node_ids == ["n1"] and row.model_name == "llama3-8b"
    run = observed(engine, "j5")
    assert run is not None and run.is_valid == 0 and run.dataset_tokens_per_second is None


def test_the_first_end_of_a_job_wins(engine: Engine) -> None:
    rejected = new_event(
        "job.rejected", JobRejected(rule=Rule.BATCH_NOT_MULTIPLE_OF_GPUS), job_id="j6", ts=at(1)
    )
    completed = new_event("job.completed", COMPLETED, job_id="j6", ts=at(9))
    apply_events(engine, [rejected])
    apply_events(engine, [completed])
    row = job(engine, "j6")
    assert (row.state, row.outcome, row.rule) == ("rejected", "rejected", "batch_size_not_multiple_of_gpus")
    assert observed(engine, "j6") is None


def test_node_status_keeps_the_newest_report(engine: Engine) -> None:
    def status(state: str, minutes: float) -> Event:
        payload = NodeStatus(node_id="l40s-00", gpu_model="L40S", gpu_count=8, status=state)  # type: ignore[arg-type]
        return new_event("node.status", payload, job_id=None, ts=at(minutes))

    apply_events(engine, [status("up", 0), status("drain", 5)])
    apply_events(engine, [status("down", 2)])  # older than what the store has: ignored
    with engine.connect() as connection:
        node = connection.execute(select(Node)).one()
    assert (node.node_id, node.status, node.gpu_count) == ("l40s-00", "drain", 8)


def test_hooks_run_in_the_transaction_with_only_new_events(engine: Engine) -> None:
    seen: list[list[str]] = []

    def hook(connection: Connection, events: list[Event]) -> None:
        assert connection.in_transaction()
        seen.append([e.type for e in events])

    events = lifecycle("j7")
    apply_events(engine, events[:2], [hook])
    apply_events(engine, events, [hook])
    assert seen == [["job.submitted", "job.started"], ["job.progress", "job.progress", "job.completed"]]

    def failing(_connection: Connection, _events: list[Event]) -> None:
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError):
        apply_events(engine, lifecycle("j8"), [failing])
    assert store_count(engine, Job) == 1  # j8's batch rolled back with its hook


def test_a_shuffled_replay_applied_twice_matches_the_benchmark(
    engine: Engine, sample_table: pd.DataFrame
) -> None:
    rows = sample_table.sample(n=300, random_state=7)
    plan = plan_replay(rows, seed=11, job_prefix="shuffled-")
    events = [event for _, event in plan.events]
    random.Random(3).shuffle(events)  # every job's events arrive in any order
    for start in range(0, len(events), 250):
        apply_events(engine, events[start : start + 250])
    random.Random(4).shuffle(events)
    assert apply_events(engine, events).applied == 0  # the whole stream redelivered
    assert_store_matches_benchmark(engine, rows, plan, "shuffled-")


def test_two_workers_racing_on_the_same_events_apply_each_once(postgres_url: str) -> None:
    """A rebalance can hand events to a second worker while the first is still applying them (PostgreSQL):
    the second waits for the first's transaction, then skips what it committed and builds on its rows."""
    from finetwin.schema import migrate
    from twin.db import make_engine

    engine = make_engine(postgres_url)
    migrate(engine)
    jobs = [lifecycle(f"race-{n}") for n in range(40)]
    first_half = [e for events in jobs for e in events[:3]]
    second_half = [e for events in jobs for e in events[2:]]  # overlaps the first at each job's 3rd event
    first_applied = threading.Event()
    results: dict[str, object] = {}

    def second_is_blocked() -> bool:
        with engine.connect() as probe:
            waiting = probe.execute(text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ))  # fmt: skip
            return waiting.scalar_one() > 0

    def hold_until_second_waits(_connection: Connection, _events: list[Event]) -> None:
        first_applied.set()
        wait_for(second_is_blocked, 30, "the second worker to wait on the first one's rows")

    def second() -> None:
        first_applied.wait(30)
        results["second"] = apply_events(engine, second_half)

    thread = threading.Thread(target=second)
    thread.start()
    results["first"] = apply_events(engine, first_half, [hold_until_second_waits])
    thread.join(timeout=60)
    first, second_result = results["first"], results["second"]
    assert (first.applied, first.duplicates) == (120, 0)  # type: ignore[attr-defined]
    assert (second_result.applied, second_result.duplicates) == (80, 40)  # type: ignore[attr-defined]
    assert store_count(engine) == 200
    with engine.connect() as connection:
        states = connection.execute(
            text("SELECT state, outcome, count(*) FROM jobs GROUP BY state, outcome")
        ).all()
    assert states == [("completed", "valid", 40)] and store_count(engine, ObservedRun) == 40
    engine.dispose()


def _aware(ts: datetime | None) -> datetime | None:
    return ts.replace(tzinfo=UTC) if ts is not None and ts.tzinfo is None else ts


def test_a_number_too_big_for_its_column_is_refused_not_wrapped(pg_engine: Engine) -> None:
    """The largest GPU count PostgreSQL's `integer` holds is stored as it is; one more is refused, with the
    database's reason (ingest dead-letters such an event), and its batch leaves nothing behind."""
    largest = SUBMITTED.model_copy(update={"number_gpus": 2**31 - 1})
    apply_events(pg_engine, [new_event("job.submitted", largest, job_id="largest")])
    assert job(pg_engine, "largest").number_gpus == 2**31 - 1
    too_big = SUBMITTED.model_copy(update={"number_gpus": 2**31})
    with pytest.raises(DataError, match="NumericValueOutOfRange"):
        apply_events(pg_engine, [new_event("job.submitted", too_big, job_id="too-big")])
    assert store_count(pg_engine) == 1 and store_count(pg_engine, Job) == 1


def test_event_ids_are_the_idempotency_key_not_the_content(engine: Engine) -> None:
    first = new_event("job.submitted", SUBMITTED, job_id="j9", ts=at(0))
    same_id = new_event("job.submitted", SUBMITTED, job_id="j9", ts=at(0), event_id=first.event_id)
    other_id = new_event("job.submitted", SUBMITTED, job_id="j9", ts=at(0), event_id=uuid.uuid4())
    assert apply_events(engine, [first, same_id]).applied == 1
    assert apply_events(engine, [other_id]).applied == 1
    assert store_count(engine) == 2


def test_a_second_submission_fills_in_what_is_missing_and_never_changes_what_is_there(engine: Engine) -> None:
    """A late or repeated `job.submitted` rewrote a finished job's configuration (and blanked what it left
    out), so its measured run was credited to another configuration."""
    apply_events(engine, lifecycle("j10"))
    without_tenant = SUBMITTED.model_copy(update={"tenant": None})
    again = new_event("job.submitted", without_tenant, job_id="j10", ts=at(12))
    assert apply_events(engine, [again]).applied == 1  # agrees with the job: applied, changes nothing
    row = job(engine, "j10")
    assert (row.tenant, row.dataset_tokens, row.state) == ("team-a", 1.2e7, "completed")
    other = SUBMITTED.model_copy(update={"model_name": "mixtral-8x7b-instruct-v0.1", "number_gpus": 1})
    changed = new_event("job.submitted", other, job_id="j10", ts=at(13))
    with pytest.raises(ConflictingEvent, match=r"model_name 'llama3-8b' -> 'mixtral-8x7b-instruct-v0.1'"):
        apply_events(engine, [changed])
    assert (job(engine, "j10").model_name, job(engine, "j10").number_gpus) == ("llama3-8b", 4)
    assert store_count(engine) == 6  # the conflicting event was rolled back with its batch
    # A submission after a completion fills the job in; a field the first left out is filled in later.
    completed_first = [
        new_event("job.completed", COMPLETED, job_id="j11", ts=at(11)),
        new_event("job.submitted", without_tenant, job_id="j11", ts=at(0)),
        new_event("job.submitted", SUBMITTED, job_id="j11", ts=at(0)),
    ]
    apply_events(engine, completed_first)
    assert (job(engine, "j11").model_name, job(engine, "j11").tenant) == ("llama3-8b", "team-a")


def test_another_cluster_s_event_for_a_job_id_is_a_conflict(engine: Engine) -> None:
    """The store keys jobs by id: a `lab-b` submission of job `j12` rewrote the default cluster's job."""
    apply_events(engine, lifecycle("j12"))
    theirs = new_event("job.submitted", SUBMITTED, job_id="j12", ts=at(20), cluster_id="lab-b")
    with pytest.raises(ConflictingEvent, match="job 'j12' is a job of cluster 'default', not 'lab-b'"):
        apply_events(engine, [theirs])
    assert job(engine, "j12").cluster_id == "default"
