"""Scheduling policies: the EASY and conservative backfill properties, SPF's order, and the GPU profile
conservative backfill plans on."""

from __future__ import annotations

import numpy as np

from tests.twin.conftest import A100
from twin.cluster import cluster_from_spec
from twin.gpu_profile import UsageProfile
from twin.plan import JobPlan, build_plan, prepare_catalog
from twin.policies import Placement, Policy
from twin.simulator import End, simulate
from twin.workload import Workload


def busy_workload(seed: int, n: int = 4000) -> Workload:
    rng = np.random.default_rng(seed)
    gpus = rng.choice([1, 2, 4, 8, 16, 24], size=n, p=[0.3, 0.2, 0.2, 0.15, 0.1, 0.05])
    duration = rng.lognormal(6.0, 1.0, n)
    # Offered load ~0.95 of 48 GPUs: the queue is long and backfill has work to do.
    rate = 0.95 * 48 / float((gpus * duration).mean())
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    return Workload.from_durations(arrival, duration, gpus=gpus, gpu_model=A100)


def test_backfill_never_delays_the_head_job_past_its_reservation() -> None:
    # With exact run-time estimates (fixed durations), a job that was promised a start time as the head
    # of the queue starts no later than that, however many jobs were backfilled around it.
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 6}]})
    for seed in (1, 2, 3):
        workload = busy_workload(seed)
        plan = build_plan(workload, prepare_catalog([], None), cluster, None)
        result = simulate(cluster, plan, Policy.BACKFILL)
        assert (result.outcome == End.COMPLETED).all()
        assert result.reservations
        for job, promised in result.reservations.items():
            assert result.start_s[job] <= promised + 1e-6, (seed, job)
        # Non-vacuous: jobs did overtake earlier ones.
        order = np.argsort(result.start_s, kind="stable")
        assert (np.diff(order) < 0).sum() > 100


def test_backfill_waits_less_than_fifo_on_a_busy_cluster() -> None:
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 6}]})
    workload = busy_workload(4)
    plan = build_plan(workload, prepare_catalog([], None), cluster, None)
    fifo = simulate(cluster, plan, Policy.FIFO)
    easy = simulate(cluster, plan, Policy.BACKFILL)
    assert np.mean(easy.start_s - plan.arrival_s) < 0.8 * np.mean(fifo.start_s - plan.arrival_s)


def test_spf_starts_waiting_jobs_shortest_first() -> None:
    # One GPU busy until t=100; five jobs queue meanwhile; SPF runs them by duration, FIFO by arrival.
    durations = [100.0, 50.0, 10.0, 40.0, 20.0, 30.0]
    workload = Workload.from_durations([0.0, 1, 2, 3, 4, 5], durations, gpu_model=A100)
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 1, "gpus_per_node": 1}]})
    plan = build_plan(workload, prepare_catalog([], None), cluster, None)
    spf = simulate(cluster, plan, Policy.SPF)
    assert np.argsort(spf.start_s).tolist() == [0, 2, 4, 5, 3, 1]
    fifo = simulate(cluster, plan, Policy.FIFO)
    assert np.argsort(fifo.start_s).tolist() == [0, 1, 2, 3, 4, 5]


def test_placement_best_fit_and_whole_nodes() -> None:
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 3}]})
    placement = Placement(cluster)
    first = placement.place(0, 6)
    assert first == ((0, 6),)
    assert placement.place(0, 2) == ((0, 2),)  # the 2 free on node 0 fit exactly: best fit
    assert placement.place(0, 3) == ((1, 3),)
    assert placement.place(0, 16) is None  # only one whole node (2) is left
    assert placement.place(0, 8) == ((2, 8),)
    placement.release(first)
    assert placement.place(0, 9) is None and placement.free_total[0] == 11


def two_nodes_of_four() -> dict:
    return {"nodes": [{"gpu_model": A100, "count": 2, "gpus_per_node": 4}]}


def plan_of(cluster_spec: dict, arrival: list[float], gpus: list[int], duration: list[float]) -> JobPlan:
    workload = Workload.from_durations(arrival, duration, gpus=gpus, gpu_model=A100)
    return build_plan(workload, prepare_catalog([], None), cluster_from_spec(cluster_spec), None)


def test_conservative_backfill_protects_every_waiting_job_not_only_the_head() -> None:
    # Two nodes of 4 GPUs, exact estimates. J0 (1 GPU) runs on node 0 until 10, J1 (4) on node 1 until 21;
    # J2 (8, both nodes) waits for 21. J3 (4 GPUs, 5 s) fits on node 0 from 10 to 15, before J2. J4 (1 GPU,
    # 10 s) could start now on node 0's free GPUs without delaying the head J2: EASY starts it (and J3 then
    # waits for it, until 14); conservative does not, as it would delay J3's reservation, and runs it after
    # J2. FIFO starts nothing ahead of J2.
    cluster_spec = two_nodes_of_four()
    plan = plan_of(cluster_spec, [0, 1, 2, 3, 4], [1, 4, 8, 4, 1], [10, 20, 20, 5, 10])
    cluster = cluster_from_spec(cluster_spec)
    assert simulate(cluster, plan, Policy.CONSERVATIVE).start_s.tolist() == [0, 1, 21, 10, 41]
    assert simulate(cluster, plan, Policy.BACKFILL).start_s.tolist() == [0, 1, 21, 14, 4]
    assert simulate(cluster, plan, Policy.FIFO).start_s.tolist() == [0, 1, 21, 41, 41]


def small_random_plans(count: int) -> list[tuple[dict, JobPlan]]:
    """Tiny clusters and queues with few distinct durations, so that jobs end at the same instant."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(count):
        nodes = int(rng.integers(1, 4))
        spec = {"nodes": [{"gpu_model": A100, "count": nodes, "gpus_per_node": 4}]}
        n = int(rng.integers(3, 12))
        arrival = np.sort(rng.choice([0.0, 1, 2, 3, 5, 8, 13], n)).tolist()
        gpus = np.minimum(rng.choice([1, 2, 4, 8, 12], n), 4 * nodes).tolist()
        out.append((spec, plan_of(spec, arrival, gpus, rng.choice([5.0, 10, 20, 40], n).tolist())))
    return out


def test_conservative_backfill_never_delays_a_job_past_its_first_reservation() -> None:
    # With exact estimates a reservation only ever moves earlier (the job's own slot stays free while the
    # others are compressed around it), so every job starts no later than the first start it was promised:
    # on tiny clusters whose jobs end together, and on a long busy queue.
    cases = [(cluster_from_spec(spec), plan) for spec, plan in small_random_plans(400)]
    big = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 6}]})
    cases.append((big, build_plan(busy_workload(5, 1500), prepare_catalog([], None), big, None)))
    overtakes = promised = 0
    for cluster, plan in cases:
        result = simulate(cluster, plan, Policy.CONSERVATIVE)
        assert (result.outcome == End.COMPLETED).all()
        assert result.reservations is not None
        for job, at in result.reservations.items():
            assert result.start_s[job] <= at + 1e-9, (plan.arrival_s.tolist(), job)
        promised += len(result.reservations)
        order = np.argsort(result.start_s, kind="stable")
        overtakes += int((np.diff(order) < 0).sum())
    # Non-vacuous: many jobs were promised a later start, and jobs did start ahead of earlier ones.
    assert promised > 1000 and overtakes > 300


def test_conservative_backfill_with_wrong_estimates_never_oversubscribes_a_node() -> None:
    # Estimates off by up to 3x either way: jobs outrun their reservations' ends and end early; the queue
    # still drains, and no node ever holds more GPUs than it has.
    rng = np.random.default_rng(11)
    cluster = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 4}]})
    plan = build_plan(busy_workload(6, 800), prepare_catalog([], None), cluster, None)
    plan.estimate_s = plan.hold_s * np.exp(rng.uniform(-1.1, 1.1, len(plan)))
    result = simulate(cluster, plan, Policy.CONSERVATIVE, record_placements=True)
    assert (result.outcome == End.COMPLETED).all()
    assert result.placements is not None
    changes: list[tuple[float, int, int]] = []  # (time, ends first, node, +-gpus)
    for job, alloc in enumerate(result.placements):
        assert alloc is not None
        for node, gpus in alloc:
            changes += [(result.start_s[job], 1, node, gpus), (result.end_s[job], 0, node, -gpus)]
    held = [0] * len(cluster.nodes)
    for _, _, node, gpus in sorted(changes):
        held[node] += gpus
        assert held[node] <= cluster.nodes[node].gpus
    assert np.mean(result.start_s - plan.arrival_s) > 0  # non-vacuous: jobs did queue


def test_conservative_backfill_starts_a_job_on_free_gpus_before_gpus_whose_job_outran_its_estimate() -> None:
    # Four nodes of 4 GPUs, all busy from 0: node 0 by J0, estimated to end at 5 but running until 20;
    # nodes 1-3 by jobs that end at 8, as estimated. J2 (4 GPUs) and J3 (8 GPUs, two whole nodes) queue.
    # At 8 node 0 is free by the promises but still held: both start at 8 on the GPUs freed then, not at 20
    # on node 0.
    spec = {"nodes": [{"gpu_model": A100, "count": 4, "gpus_per_node": 4}]}
    plan = plan_of(spec, [0, 0, 0, 0, 1, 2], [4, 4, 4, 4, 4, 8], [20, 8, 8, 8, 10, 10])
    plan.estimate_s[0] = 5.0
    result = simulate(cluster_from_spec(spec), plan, Policy.CONSERVATIVE)
    assert result.start_s.tolist() == [0, 0, 0, 0, 8, 8]


def profile_earliest_by_brute_force(
    promises: list[tuple[float, float, int]], now: float, limit: int, duration: float
) -> float:
    def in_use(t: float) -> int:
        return sum(g for s, e, g in promises if s <= t < e)

    points = sorted({x for s, e, _ in promises for x in (s, e) if x > now})
    for start in [now, *points]:
        checks = [start] + [p for p in points if start < p < start + duration]
        if all(in_use(c) <= limit for c in checks):
            return start
    raise AssertionError("a profile's promises all end")


def test_usage_profile_earliest_start_and_free_stretches_equal_brute_force_and_stay_compact() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        profile, promises = UsageProfile(), []
        for _ in range(int(rng.integers(0, 9))):
            start = float(rng.integers(0, 20))
            promise = (start, start + float(rng.integers(1, 11)), int(rng.integers(1, 5)))
            profile.add(*promise)
            promises.append(promise)
        for promise in list(promises):  # some taken back
            if rng.random() < 0.3:
                profile.add(promise[0], promise[1], -promise[2])
                promises.remove(promise)
        now = float(rng.integers(0, 26))
        if rng.random() < 0.5:
            profile.prune(now)
        limit, duration = int(rng.integers(0, 9)), float(rng.integers(1, 9))
        expected = profile_earliest_by_brute_force(promises, now, limit, duration)
        assert profile.earliest(now, limit, duration) == expected
        # Its stretches with room: a job may start at t exactly when the earliest start from t is t.
        stretches = profile.free_stretches(now, limit, duration)
        for t in np.arange(now, 40.0, 0.5):
            fits = any(begin <= t and t + duration <= end for begin, end in stretches)
            assert fits == (profile_earliest_by_brute_force(promises, float(t), limit, duration) == t)
        # A breakpoint that changes nothing is merged away: two per promise at most.
        assert len(profile.times) <= 2 * len(promises) + 1
