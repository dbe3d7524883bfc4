"""The simulator against queueing theory: single-GPU jobs, Poisson arrivals, exponential durations, FIFO.

The reference is computed here, independently of the simulator: a first-come-first-served c-server queue
(Kiefer-Wolfowitz: each job starts when it arrives or when the earliest server frees, whichever is later)
and the Erlang-C mean wait of the M/M/c queue.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from tests.twin.conftest import A100
from twin.cluster import cluster_from_spec
from twin.plan import build_plan, prepare_catalog
from twin.simulator import End, simulate
from twin.workload import Workload


def fcfs_waits(arrival: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
    free = [0.0] * servers
    waits = np.empty(len(arrival))
    for i, (a, s) in enumerate(zip(arrival.tolist(), service.tolist(), strict=True)):
        start = max(a, heapq.heappop(free))
        waits[i] = start - a
        heapq.heappush(free, start + s)
    return waits


def erlang_c_mean_wait(arrival_rate: float, service_rate: float, servers: int) -> float:
    offered = arrival_rate / service_rate
    assert offered < servers
    below = sum(offered**k / math.factorial(k) for k in range(servers))
    top = offered**servers / math.factorial(servers) * servers / (servers - offered)
    return top / (below + top) / (servers * service_rate - arrival_rate)


def mmc_waits(
    cluster_spec: dict, servers: int, n: int, load: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    mean_service = 100.0
    rate = load * servers / mean_service
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    service = rng.exponential(mean_service, n)
    cluster = cluster_from_spec(cluster_spec)
    plan = build_plan(Workload.from_durations(arrival, service), prepare_catalog([], None), cluster, None)
    result = simulate(cluster, plan)
    assert (result.outcome == End.COMPLETED).all()
    return result.start_s - plan.arrival_s, fcfs_waits(arrival, service, servers)


def test_job_by_job_waits_equal_a_fcfs_c_server_queue() -> None:
    # 16 GPUs in nodes of unequal size: a single-GPU job may use any free GPU, so it is an M/M/16 queue.
    spec = {"nodes": [{"gpu_model": A100, "count": 1, "gpus_per_node": 8},
                      {"gpu_model": A100, "count": 1, "gpus_per_node": 4},
                      {"gpu_model": A100, "count": 2, "gpus_per_node": 2}]}  # fmt: skip
    simulated, reference = mmc_waits(spec, 16, 20_000, load=0.9, seed=1)
    assert (reference > 0).mean() > 0.3  # a real queue, not an idle cluster
    np.testing.assert_allclose(simulated, reference, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_erlang_c_mean_wait_on_half_a_million_jobs() -> None:
    servers, load, mean_service = 16, 0.8, 100.0
    spec = {"nodes": [{"gpu_model": A100, "count": 2, "gpus_per_node": 8}]}
    simulated, reference = mmc_waits(spec, servers, 500_000, load=load, seed=2)
    expected = erlang_c_mean_wait(load * servers / mean_service, 1.0 / mean_service, servers)
    assert simulated.mean() == pytest.approx(expected, rel=0.05)
    assert simulated.mean() == pytest.approx(reference.mean(), rel=1e-9)
