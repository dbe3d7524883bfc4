"""What the store holds of a job is a function of the events it was sent, not of the order they arrived in,
and the state rebuilt from the stored events (`twin.rebuild`) is that same state.

Real telemetry contradicts itself: an agent reports a job failed and the scheduler that it completed; a
stale agent reports progress after the job ended; two reports carry the same time. Each rule below picks
one of them by the events' own times (and their values, on a tie), never by which came first, so that the
live twin (the store) and a backtest (the rebuild) see the same cluster.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine
from sqlmodel import Session, select

from finetwin.schema import migrate
from ingest.apply import apply_events
from ingest.events import (
    JobCompleted,
    JobFailed,
    JobProgress,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeStatus,
    new_event,
)
from tests.twin.test_store_backtest import apply_shuffled
from twin.db import make_engine
from twin.domain import Rule
from twin.rebuild import rebuild_at
from twin.store import Job, Node, ObservedRun

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
CONFIG = {
    "model_name": "llama-3-8b", "method": "lora", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 2,
    "number_nodes": 1, "batch_size": 8, "tokens_per_sample": 2048,
}  # fmt: skip
COMPARED = (
    "state", "outcome", "submitted_at", "started_at", "ended_at", "node_ids", "tokens_processed",
    "last_tokens_per_second", "last_gpu_memory_peak_pct", "last_power_watts", "failed_after_s",
    "failure_reason", "rule", "model_name", "tenant", "dataset_tokens", "experiment_id", "progress_at",
)  # fmt: skip
RUN_COMPARED = (
    "is_valid",
    "observed_at",
    "train_runtime",
    "dataset_tokens_per_second",
    "gpu_power_watts_avg",
)

# Few distinct times and values, so that ties and contradictions are common.
minute = st.integers(0, 5)
tokens = st.sampled_from([0.0, 1e6, 2e6])


def at(m: int) -> datetime:
    return T0 + timedelta(minutes=m)


@st.composite
def job_event(draw: st.DrawFn, job_id: str) -> Any:
    kind = draw(st.sampled_from(["submitted", "started", "progress", "progress", "completed", "failed",
                                 "rejected"]))  # fmt: skip
    ts = at(draw(minute))
    if kind == "submitted":  # the configuration, with some of its optional fields or none
        extra = draw(st.fixed_dictionaries({}, optional={"tenant": st.just("team-a"),
                                                         "dataset_tokens": st.just(4e6),
                                                         "experiment_id": st.just("exp-1")}))  # fmt: skip
        return new_event("job.submitted", JobSubmitted(**CONFIG, **extra), job_id=job_id, ts=ts)
    if kind == "started":
        nodes = draw(st.sampled_from([["n1"], ["n2"], ["n1", "n2"]]))
        return new_event("job.started", JobStarted(node_ids=nodes), job_id=job_id, ts=ts)
    if kind == "progress":
        payload = JobProgress(
            tokens_processed=draw(tokens), tokens_per_second=draw(st.sampled_from([100.0, 200.0])),
            gpu_memory_peak_pct=draw(st.sampled_from([None, 50.0])),
            power_watts=draw(st.sampled_from([None, 300.0, 400.0])),
        )  # fmt: skip
        return new_event("job.progress", payload, job_id=job_id, ts=ts)
    if kind == "completed":
        payload = JobCompleted(
            train_runtime=draw(st.sampled_from([60.0, 90.0])), dataset_tokens_per_second=500.0,
            gpu_power_watts_avg=draw(st.sampled_from([None, 350.0])),
        )  # fmt: skip
        return new_event("job.completed", payload, job_id=job_id, ts=ts)
    if kind == "failed":
        payload = JobFailed(
            reason=draw(st.sampled_from(["oom", "other"])), seconds_into_run=draw(minute) * 60
        )
        return new_event("job.failed", payload, job_id=job_id, ts=ts)
    return new_event(
        "job.rejected", JobRejected(rule=draw(st.sampled_from(list(Rule)))), job_id=job_id, ts=ts
    )


@st.composite
def node_event(draw: st.DrawFn) -> Any:
    payload = NodeStatus(node_id=draw(st.sampled_from(["n1", "n2"])), gpu_model="NVIDIA-A100-SXM4-80GB",
                         gpu_count=draw(st.sampled_from([4, 8])),
                         status=draw(st.sampled_from(["up", "down", "drain"])))  # fmt: skip
    return new_event("node.status", payload, job_id=None, ts=at(draw(minute)))


events = st.lists(st.one_of(job_event("job-a"), job_event("job-b"), node_event()), min_size=1, max_size=14)


def stored(engine: Engine) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The jobs, their observed runs and the nodes, as comparable values."""
    with Session(engine) as session:
        jobs = {j.job_id: {c: _utc(getattr(j, c)) for c in COMPARED} for j in session.exec(select(Job))}
        runs = {
            r.job_id: {c: _utc(getattr(r, c)) for c in RUN_COMPARED}
            for r in session.exec(select(ObservedRun))
        }
        nodes = {n.node_id: (n.status, n.gpu_count, _utc(n.updated_at)) for n in session.exec(select(Node))}
    return jobs, runs, nodes


def _utc(value: Any) -> Any:
    return value.replace(tzinfo=UTC) if isinstance(value, datetime) and value.tzinfo is None else value


def deliver(engine: Engine, sent: list[Any], seed: int) -> None:
    """In a shuffled order, in batches of 1-4 (a dozen events still arrive in many orders), a third twice."""
    apply_shuffled(engine, sent, seed, max_batch=4, repeated=1 / 3)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> list[Engine]:
    made = []
    for name in ("first", "second"):
        engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp(name) / 'finetwin.db'}")
        migrate(engine)
        made.append(engine)
    return made


def empty(engine: Engine) -> None:
    with engine.begin() as connection:
        for table in ("observed_runs", "jobs", "nodes", "telemetry_events"):
            connection.exec_driver_sql(f"DELETE FROM {table}")


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(sent=events, seeds=st.tuples(st.integers(0, 2**16), st.integers(0, 2**16)))
def test_the_store_holds_the_same_whatever_the_delivery_order(
    stores: list[Engine], sent: list[Any], seeds: tuple[int, int]
) -> None:
    for engine, seed in zip(stores, seeds, strict=True):
        empty(engine)
        deliver(engine, sent, seed)
    first, second = (stored(engine) for engine in stores)
    assert first == second


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(sent=events, seed=st.integers(0, 2**16), cut=minute)
def test_the_state_rebuilt_at_t_is_what_the_store_held_at_t(
    stores: list[Engine], sent: list[Any], seed: int, cut: int
) -> None:
    everything, then = stores
    for engine in stores:
        empty(engine)
    deliver(everything, sent, seed)
    deliver(then, [e for e in sent if e.ts <= at(cut)], seed)  # what the store held at T
    jobs, _, nodes = stored(then)
    rebuilt = rebuild_at(everything, "default", at(cut))
    assert {job_id: {c: _utc(getattr(j, c)) for c in COMPARED} for job_id, j in rebuilt.jobs.items()} == jobs
    assert {n.node_id: (n.status, n.gpu_count, _utc(n.updated_at)) for n in rebuilt.nodes} == nodes


def test_an_earlier_terminal_event_that_arrives_later_ends_the_job(engine: Engine) -> None:
    """Failed at 12:05 arrives first; completed at 12:02 arrives after it: the job completed at 12:02, and
    its observed run is the completed one. Then a rejection dated 12:01: the job was rejected, and has no
    run. (On both stores: the run is replaced, then deleted, by each one's own statements.)"""
    submitted = new_event("job.submitted", JobSubmitted(**CONFIG), job_id="j", ts=at(0))
    failed = new_event("job.failed", JobFailed(reason="oom", seconds_into_run=240), job_id="j", ts=at(5))
    progress = new_event("job.progress", JobProgress(tokens_processed=2e6, tokens_per_second=100.0,
                                                     power_watts=400.0), job_id="j", ts=at(3))  # fmt: skip
    completed = new_event("job.completed", JobCompleted(train_runtime=90.0, dataset_tokens_per_second=500.0),
                          job_id="j", ts=at(2))  # fmt: skip
    for event in (submitted, failed, progress, completed):
        apply_events(engine, [event])
    jobs, runs, _ = stored(engine)
    assert (jobs["j"]["state"], jobs["j"]["outcome"], jobs["j"]["ended_at"]) == ("completed", "valid", at(2))
    assert (jobs["j"]["failure_reason"], jobs["j"]["failed_after_s"]) == (None, None)
    assert runs["j"]["is_valid"] == 1 and runs["j"]["train_runtime"] == 90.0
    # The progress at 12:03 came before the end at 12:02 did, and is dated after it: not the job's.
    assert jobs["j"]["tokens_processed"] is None and jobs["j"]["last_power_watts"] is None
    rule = next(iter(Rule))
    apply_events(engine, [new_event("job.rejected", JobRejected(rule=rule), job_id="j", ts=at(1))])
    jobs, runs, _ = stored(engine)
    assert (jobs["j"]["state"], jobs["j"]["rule"], jobs["j"]["ended_at"]) == ("rejected", str(rule), at(1))
    assert runs == {}
