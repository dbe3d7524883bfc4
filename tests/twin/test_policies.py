"""Scheduling policies: the EASY backfill property, and SPF's order."""

from __future__ import annotations

import numpy as np

from tests.twin.conftest import A100
from twin.cluster import cluster_from_spec
from twin.plan import build_plan, prepare_catalog
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
