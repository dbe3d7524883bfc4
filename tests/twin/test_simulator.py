"""The simulator: exact times on a hand-computed case, determinism, conservation, capacity and placement."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import simpy

from tests.twin.conftest import A100, RuleModels, config_workload, mixed_cluster, one_node
from twin.cluster import cluster_from_spec
from twin.ensemble import job_table
from twin.plan import PlanOptions, Reject, build_plan, prepare_catalog
from twin.policies import Policy
from twin.randomness import run_key
from twin.simulator import End, simulate
from twin.workload import RunningState, Workload


def three_jobs() -> Workload:
    # One node of 8 GPUs. j1 takes 4 GPUs for 100 s; j2 needs all 8 for 50 s; j3 needs 2 for 30 s.
    return Workload.from_durations([0.0, 10.0, 20.0], [100.0, 50.0, 30.0], gpus=[4, 8, 2], gpu_model=A100)


def run(workload: Workload, cluster, policy: Policy | str = Policy.FIFO, until: float | None = None):
    plan = build_plan(workload, prepare_catalog([], None), cluster, None)
    return plan, simulate(cluster, plan, policy, until, record_placements=True)


def test_three_jobs_fifo_exact_times() -> None:
    # FIFO: j2 waits for j1 (t=100); j3 fits next to j1 but may not pass j2, so it waits for j2 (t=150).
    plan, result = run(three_jobs(), one_node())
    assert result.start_s.tolist() == [0.0, 100.0, 150.0]
    assert result.end_s.tolist() == [100.0, 150.0, 180.0]
    assert (result.outcome == End.COMPLETED).all()
    assert [r["wait_s"] for r in job_table(plan, result)] == [0.0, 90.0, 130.0]


def test_three_jobs_backfill_exact_times() -> None:
    # EASY: j2 is promised t=100; j3 (ends at 50 < 100) starts at once in the 4 free GPUs.
    _, result = run(three_jobs(), one_node(), Policy.BACKFILL)
    assert result.start_s.tolist() == [0.0, 100.0, 20.0]
    assert result.end_s.tolist() == [100.0, 150.0, 50.0]
    assert result.reservations == {1: 100.0}


def test_three_jobs_spf_exact_times() -> None:
    # Shortest predicted first: at t=20 j3 (30 s) is the shortest waiting job and fits beside j1.
    _, result = run(three_jobs(), one_node(), Policy.SPF)
    assert result.start_s.tolist() == [0.0, 100.0, 20.0]
    # With j3 needing the whole node too, both wait for j1; at t=100 j3 (30 s) goes before j2 (50 s).
    whole = Workload.from_durations([0.0, 10.0, 20.0], [100.0, 50.0, 30.0], gpus=[4, 8, 8], gpu_model=A100)
    _, fifo = run(whole, one_node(), Policy.FIFO)
    _, spf = run(whole, one_node(), Policy.SPF)
    assert fifo.start_s.tolist() == [0.0, 100.0, 150.0]
    assert spf.start_s.tolist() == [0.0, 130.0, 100.0]
    assert spf.end_s.tolist() == [100.0, 180.0, 130.0]


def test_horizon_leaves_jobs_pending() -> None:
    plan, result = run(three_jobs(), one_node(), until=120.0)
    assert result.outcome.tolist() == [End.COMPLETED, End.PENDING, End.PENDING]
    assert [r["outcome"] for r in job_table(plan, result)] == ["completed", "running", "queued"]


def test_running_job_at_start_is_placed_first_and_finishes_its_rest() -> None:
    workload = three_jobs()
    workload.running = {0: RunningState(elapsed_s=60.0)}  # j1 has run 60 of its 100 s
    workload.arrival_s[0] = -70.0
    _, result = run(workload, one_node())
    assert result.start_s[0] == -60.0 and result.end_s[0] == 40.0
    assert result.start_s[1] == 40.0  # j2 (arrives at 10) starts when j1's rest is done


def test_jobs_waiting_when_the_run_starts_are_scheduled_as_one_queue() -> None:
    # One node of 8 GPUs; a running job holds 4 until t=50. Waiting at the start: j1 (4 GPUs, 100 s, queued
    # first) and j2 (8 GPUs, 10 s). Under SPF j2 is the head and blocks: it runs at 50, then j1 at 60. Had
    # the waiting jobs been handed over one at a time, j1 would have started at 0, before j2 was known.
    workload = Workload.from_durations(
        [-60.0, -10.0, -5.0], [100.0, 100.0, 10.0], gpus=[4, 4, 8], gpu_model=A100
    )
    workload.running = {0: RunningState(elapsed_s=50.0)}
    _, spf = run(workload, one_node(), Policy.SPF)
    assert spf.start_s.tolist() == [-50.0, 60.0, 50.0]
    _, fifo = run(workload, one_node(), Policy.FIFO)  # j1 is FIFO's head and fits beside the running job
    assert fifo.start_s.tolist() == [-50.0, 0.0, 100.0]


def test_same_seed_same_run_other_seed_other_run(models: RuleModels) -> None:
    cluster = mixed_cluster()
    workload = config_workload(np.random.default_rng(3), 400, 20_000.0)
    catalog = prepare_catalog(workload.catalog, models)

    def jobs(seed: int) -> list[dict[str, object]]:
        plan = build_plan(workload, catalog, cluster, run_key(np.random.default_rng(seed)))
        return job_table(plan, simulate(cluster, plan, Policy.BACKFILL, env=simpy.Environment()))

    assert jobs(7) == jobs(7)
    assert jobs(7) != jobs(8)


@pytest.mark.parametrize("policy", list(Policy))
def test_every_job_ends_exactly_once_within_capacity(models: RuleModels, policy: Policy) -> None:
    cluster = mixed_cluster()
    workload = config_workload(np.random.default_rng(11), 600, 30_000.0)
    plan = build_plan(workload, prepare_catalog(workload.catalog, models), cluster, 12345)
    result = simulate(cluster, plan, policy, record_placements=True)

    # Conservation: one terminal outcome each, and the books agree with the plan.
    assert set(np.unique(result.outcome)) <= {End.COMPLETED, End.FAILED, End.REJECTED}
    rejected = result.outcome == End.REJECTED
    assert (rejected == (plan.reject != Reject.NONE)).all()
    assert (result.outcome[~rejected] == np.where(plan.fails[~rejected], End.FAILED, End.COMPLETED)).all()
    assert np.isnan(result.start_s[rejected]).all() and not np.isnan(result.start_s[~rejected]).any()
    assert np.allclose(result.end_s[~rejected] - result.start_s[~rejected], plan.hold_s[~rejected])
    assert (result.start_s[~rejected] >= plan.arrival_s[~rejected] - 1e-9).all()
    # The workload has every kind of end: rule rejections, no-capacity rejections, failures, completions.
    assert {Reject.RULE, Reject.NO_CAPACITY} <= set(plan.reject.tolist())
    assert (result.outcome == End.FAILED).any() and (result.outcome == End.COMPLETED).any()

    # Capacity: at no time does a node hold more GPUs than it has.
    events: list[tuple[float, int, int, int]] = []  # (time, release-first order, node, +/- gpus)
    for job, alloc in enumerate(result.placements or []):
        if alloc is None:
            continue
        for node, gpus in alloc:
            events.append((result.start_s[job], 1, node, gpus))
            events.append((result.end_s[job], 0, node, -gpus))
    held: dict[int, int] = defaultdict(int)
    capacity = [n.gpus for n in cluster.nodes]
    for _, _, node, delta in sorted(events):
        held[node] += delta
        assert 0 <= held[node] <= capacity[node]


def test_placement_never_splits_a_job_of_up_to_eight_gpus() -> None:
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 6}]})
    rng = np.random.default_rng(5)
    n = 3000
    gpus = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 16, 24], size=n)
    workload = Workload.from_durations(
        np.sort(rng.uniform(0, 20_000, n)), rng.exponential(300, n), gpus=gpus, gpu_model=A100
    )
    _, result = run(workload, cluster, Policy.BACKFILL)
    assert (result.outcome == End.COMPLETED).all()
    for job, alloc in enumerate(result.placements or []):
        assert alloc is not None
        if gpus[job] <= 8:
            assert len(alloc) == 1 and alloc[0][1] == gpus[job]
        else:  # whole nodes, as many as it needs
            assert len(alloc) == math.ceil(gpus[job] / 8) and all(g == 8 for _, g in alloc)


def test_best_fit_keeps_a_whole_node_free() -> None:
    # Two nodes; a 4-GPU job then a 2-GPU job: best fit puts the second next to the first, so the 8-GPU job
    # arriving next starts at once on the untouched node.
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 2}]})
    workload = Workload.from_durations([0.0, 1.0, 2.0], [100.0, 100.0, 100.0], gpus=[4, 2, 8], gpu_model=A100)
    _, result = run(workload, cluster)
    placements = result.placements or []
    assert placements[0][0][0] == placements[1][0][0]
    assert result.start_s[2] == 2.0


def test_admission_reject_and_repair(models: RuleModels) -> None:
    cluster = mixed_cluster()
    workload = config_workload(np.random.default_rng(2), 300, 10_000.0)
    plain = build_plan(workload, prepare_catalog(workload.catalog, models), cluster, 1)
    reject = build_plan(
        workload, prepare_catalog(workload.catalog, models, PlanOptions(admission="reject")), cluster, 1
    )
    repair = build_plan(
        workload, prepare_catalog(workload.catalog, models, PlanOptions(admission="repair")), cluster, 1
    )
    # Off: RuleModels' big batches fail at runtime. Reject: they are turned away instead, before burning GPUs.
    assert plain.fails.any() and not reject.fails.any()
    assert ((reject.reject == Reject.PREDICTED_FAILURE) == plain.fails).all()
    # Repair: no rule rejections left; those jobs now run.
    assert (plain.reject == Reject.RULE).any() and not (repair.reject == Reject.RULE).any()
