"""Which scheduling policy the record shows (`twin.policy_fit`): a cluster that schedules by a policy is found
to schedule by it, from its telemetry alone."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine

from calibrate.registry import ModelRegistry
from finetwin.cli import main
from finetwin.schema import migrate
from ingest.apply import apply_events
from ingest.events import (
    Event,
    JobCompleted,
    JobFailed,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeStatus,
    new_event,
)
from twin.cluster import Cluster, NodeSpec
from twin.db import make_engine
from twin.domain import JobConfig, Rule
from twin.plan import Reject, build_plan, prepare_catalog
from twin.policies import Policy
from twin.policy_fit import compare, policy_fit, queue_at
from twin.simulator import simulate
from twin.uncalibrated import FallbackModels
from twin.workload import Workload

T0 = datetime(2025, 3, 1, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
CLUSTER = Cluster(tuple(NodeSpec(f"a100-{k}", A100, 8) for k in range(3)))


def config(gpus: int) -> JobConfig:
    return JobConfig(
        model_name="llama3-8b", method="lora", gpu_model=A100, number_gpus=gpus,
        number_nodes=max(1, gpus // 8), batch_size=max(8, gpus), tokens_per_sample=2048, enable_roce=False,
        fast_moe=0, fast_kernels=False,
    )  # fmt: skip


def cluster_record(
    policy: Policy, seed: int, jobs: int = 260, epoch: datetime = T0, load: float = 0.9
) -> list[Event]:
    """The telemetry of three 8-GPU nodes whose scheduler runs `policy`: jobs of 1-16 GPUs at `load`,
    each running 0.5-2x what the twin's models expect of it (the scheduler believes the models, as the
    twin's does)."""
    rng = np.random.default_rng(seed)
    sizes = [1, 2, 4, 8, 16]
    catalog = [config(g) for g in sizes]
    pick = rng.choice(len(sizes), size=jobs, p=[0.3, 0.25, 0.2, 0.15, 0.1])
    work = rng.lognormal(17.0, 0.8, jobs)
    workload = Workload(
        job_ids=[f"job-{k:03d}" for k in range(jobs)], arrival_s=np.zeros(jobs),
        gpus=np.array([sizes[p] for p in pick]), gpu_models=[A100] * jobs, duration_s=np.full(jobs, np.nan),
        work_tokens=work, config_idx=pick.astype(np.int64), catalog=catalog,
    )  # fmt: skip
    plan = build_plan(workload, prepare_catalog(catalog, FallbackModels()), CLUSTER, 1)
    run_s = plan.estimate_s * rng.uniform(0.5, 2.0, jobs)
    rate = load * 24 / float((plan.gpus * run_s).mean())
    plan.arrival_s = np.cumsum(rng.exponential(1.0 / rate, jobs))
    plan.hold_s, plan.fails = run_s, np.zeros(jobs, dtype=bool)
    # One in twenty refused at admission, and one in twenty-five failing before it starts: neither holds a
    # GPU.
    refused = np.zeros(jobs, dtype=bool)
    refused[::20] = True
    lost = np.zeros(jobs, dtype=bool)
    lost[7::25] = True
    plan.reject[refused | lost] = Reject.RULE
    result = simulate(CLUSTER, plan, policy, record_placements=True)
    assert result.placements is not None
    events: list[Event] = [
        new_event("node.status", NodeStatus(node_id=n.node_id, gpu_model=A100, gpu_count=8, status="up"),
                  job_id=None, ts=epoch - timedelta(hours=1))
        for n in CLUSTER.nodes
    ]  # fmt: skip
    for k, job_id in enumerate(plan.job_ids):
        chosen = catalog[int(workload.config_idx[plan.row[k]])]
        tokens = float(work[plan.row[k]])

        def at(seconds: float) -> datetime:
            return epoch + timedelta(seconds=float(seconds))

        submitted = JobSubmitted(
            model_name=chosen.model_name, method=chosen.method, gpu_model=A100,
            number_gpus=chosen.number_gpus, number_nodes=chosen.number_nodes, batch_size=chosen.batch_size,
            tokens_per_sample=chosen.tokens_per_sample, dataset_tokens=tokens,
        )  # fmt: skip
        events.append(new_event("job.submitted", submitted, job_id=job_id, ts=at(plan.arrival_s[k])))
        if refused[k]:
            rule = JobRejected(rule=Rule.BATCH_NOT_MULTIPLE_OF_GPUS)
            events.append(new_event("job.rejected", rule, job_id=job_id, ts=at(plan.arrival_s[k])))
            continue
        if lost[k]:
            failed = JobFailed(reason="other", seconds_into_run=0.0)
            events.append(new_event("job.failed", failed, job_id=job_id, ts=at(plan.arrival_s[k] + 30.0)))
            continue
        alloc = result.placements[k]
        assert alloc is not None
        node_ids = [CLUSTER.nodes[node].node_id for node, _ in alloc]
        events.append(new_event("job.started", JobStarted(node_ids=node_ids), job_id=job_id,
                                ts=at(result.start_s[k])))  # fmt: skip
        done = JobCompleted(train_runtime=float(run_s[k]), dataset_tokens_per_second=tokens / float(run_s[k]))
        events.append(new_event("job.completed", done, job_id=job_id, ts=at(result.end_s[k])))
    return events


def stored(tmp_path: Path, events: list[Event]) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path}/record.db")
    migrate(engine)
    apply_events(engine, events)
    return engine


@pytest.mark.parametrize("seed", [4, 5])
@pytest.mark.parametrize("policy", list(Policy))
def test_a_cluster_is_found_to_schedule_by_the_policy_it_runs(
    tmp_path: Path, policy: Policy, seed: int
) -> None:
    engine = stored(tmp_path, cluster_record(policy, seed=seed))
    # From a time the queue is long, over most of the record.
    fit = policy_fit(engine, FallbackModels(), at=T0 + timedelta(hours=3), horizon_s=18 * 3600.0)
    engine.dispose()
    assert fit["best"] == policy.value and fit["tied"] == [policy.value], fit["policies"]
    own = fit["policies"][policy.value]
    others = [fit["policies"][p.value]["start_mae_s"] for p in Policy if p is not policy]
    # Its own policy replays the record: every job starts when it did (to the microseconds the store keeps),
    # where every other policy misses by over five minutes on average.
    assert own["start_mae_s"] < 1.0 and min(others) > 300, fit["policies"]
    assert own["jobs_compared"] > 50


def test_the_fit_reads_the_record_alike_on_both_stores(engine: Engine) -> None:
    # PostgreSQL hands back aware timestamps where SQLite's are naive: the same record, the same answer.
    apply_events(engine, cluster_record(Policy.CONSERVATIVE, seed=4))
    fit = policy_fit(engine, FallbackModels(), at=T0 + timedelta(hours=3), horizon_s=18 * 3600.0)
    assert fit["best"] == "conservative" and fit["policies"]["conservative"]["start_mae_s"] < 1.0
    assert fit["started_on_record"] > 100


def test_a_record_that_cannot_tell_the_policies_apart_names_none(tmp_path: Path) -> None:
    # A cluster so quiet that jobs hardly queue: every policy starts them as they were started, and the
    # fit says it cannot tell them apart rather than naming the first. A window in which no job started
    # says there is nothing to compare.
    engine = stored(tmp_path, cluster_record(Policy.SPF, seed=4, jobs=60, load=0.03))
    fit = policy_fit(engine, FallbackModels(), at=T0 + timedelta(hours=3), horizon_s=18 * 3600.0)
    assert fit["best"] is None and fit["tied"] == [p.value for p in Policy], fit["policies"]
    assert all(f["start_mae_s"] < 1.0 and f["jobs_compared"] > 0 for f in fit["policies"].values())
    empty = policy_fit(engine, FallbackModels(), at=T0 + timedelta(hours=3), horizon_s=1.0)
    engine.dispose()
    assert empty["best"] is None and empty["tied"] == []
    assert all(f["start_mae_s"] is None for f in empty["policies"].values())


def test_the_fit_compares_queues_and_starts_as_computed_by_hand() -> None:
    # Five jobs; edges at 0, 10, 20. Job 4 was rejected and never counts; job 3 never started on record.
    arrival = np.array([0.0, 0.0, 5.0, 12.0, 1.0])
    recorded = np.array([-5.0, 10.0, 15.0, np.nan, np.nan])
    simulated = np.array([-5.0, 4.0, 22.0, 13.0, np.nan])
    reject = np.array([Reject.NONE] * 4 + [Reject.RULE], dtype=np.int8)
    edges = np.array([0.0, 10.0, 20.0])
    # On record: at 0 job 1 waits; at 10 job 2 (job 1 started at 10); at 20 job 3.
    assert queue_at(arrival, recorded, reject, edges).tolist() == [1, 1, 1]
    # Simulated: at 0 job 1; at 10 job 2; at 20 job 2 (job 3 started at 13).
    assert queue_at(arrival, simulated, reject, edges).tolist() == [1, 1, 1]
    fit = compare(np.array([1.0, 1, 1]), np.array([1.0, 1, 2]), recorded, simulated, horizon_s=20.0)
    assert fit["queue_mae"] == pytest.approx(1 / 3) and fit["queue_bias"] == pytest.approx(1 / 3)
    # Starts, counting a start past the horizon at the horizon: job 1 -6, job 2 +5 (22 -> 20), job 3 -7
    # (13 against never, 20); job 0 was running at T, job 4 never started in either.
    assert fit["jobs_compared"] == 3
    assert fit["start_mae_s"] == pytest.approx(6.0) and fit["start_bias_s"] == pytest.approx(-8 / 3)


def test_finetwin_backtest_which_policy(
    registry_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A FIFO cluster's record, dated after the registry's first version was put in use (its models give the
    # estimates, which FIFO does not use).
    first = ModelRegistry(registry_copy).first_put_in_use()
    assert first is not None
    epoch = first + timedelta(hours=2)
    engine = stored(tmp_path, cluster_record(Policy.FIFO, seed=5, epoch=epoch))
    engine.dispose()
    monkeypatch.setenv("FINETWIN_DATABASE_URL", f"sqlite:///{tmp_path}/record.db")
    window = ["--from-store", "--at", (epoch + timedelta(hours=3)).isoformat(), "--horizon", "18h",
              "--models", str(registry_copy)]  # fmt: skip
    assert main(["backtest", *window, "--which-policy", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["best"] == "fifo" and doc["policies"]["fifo"]["start_mae_s"] == pytest.approx(0, abs=1e-3)
    assert set(doc["policies"]) == {p.value for p in Policy} and doc["in_use"] == "fifo"
    assert "v0001" in doc["models"] and doc["started_on_record"] > 100
    # The table, and what to set when the forecast assumes another policy.
    assert main(["backtest", *window, "--which-policy"]) == 0
    assert "most like fifo; FINETWIN_FORECAST_POLICY says so already" in " ".join(
        capsys.readouterr().out.split()
    )
    monkeypatch.setenv("FINETWIN_FORECAST_POLICY", "backfill")
    assert main(["backtest", *window, "--which-policy"]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "fifo (best)" in table and "queue MAE" in table
    advice = "FINETWIN_FORECAST_POLICY says backfill: set FINETWIN_FORECAST_POLICY=fifo to forecast as it"
    assert f"the record schedules most like fifo; {advice}" in table
    # A second's window: no job started in it, and the table says so instead of naming a policy.
    second = [*window[:4], "1s", *window[5:]]
    assert main(["backtest", *second, "--which-policy"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "no job started in the window: nothing tells the policies apart" in said and "(best)" not in said
    # Options of the forecast do nothing here: said, not ignored; and it needs the store.
    assert main(["backtest", *window, "--which-policy", "--runs", "4"]) == 2
    assert "--runs applies only to the twin's forecast, not with --which-policy" in capsys.readouterr().err
    assert main(["backtest", "--bench", "bundled", "--which-policy"]) == 2
    assert "--which-policy applies only with --from-store" in " ".join(capsys.readouterr().err.split())


def test_the_queue_count_equals_counting_each_job_at_each_edge() -> None:
    # Counted by sorting (a year of hourly edges over a million jobs would be a matrix of 10^10): the same as
    # asking each job at each edge whether it had arrived and not started, with never-started jobs, refused
    # ones, and starts a skewed clock dated before their arrival.
    rng = np.random.default_rng(2)
    for _ in range(50):
        n = int(rng.integers(0, 40))
        arrival = rng.uniform(-50, 100, n).round()
        start = np.where(rng.random(n) < 0.3, np.nan, arrival + rng.uniform(-10, 60, n).round())
        reject = np.where(rng.random(n) < 0.1, Reject.RULE, Reject.NONE).astype(np.int8)
        edges = np.arange(0.0, 101.0, 10.0)
        waiting = reject == Reject.NONE
        expected = [
            sum(1 for a, b in zip(arrival[waiting], start[waiting], strict=True) if a <= e and not b <= e)
            for e in edges
        ]
        assert queue_at(arrival, start, reject, edges).tolist() == expected
