"""Nodes that drain or go down, as the twin forecasts them: a draining node runs the jobs on it to their end
and takes no new one; a running job stays on the nodes telemetry says it runs on; a job whose node is down
is not running. (Before, a draining node was left out of the cluster, so the jobs running on it queued
again, waited for capacity they already held, or were rejected for want of it.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine

from finetwin.schema import migrate
from tests.twin.conftest import A100
from twin.cluster import Cluster, NodeSpec, cluster_from_inventory
from twin.db import make_engine, session_scope
from twin.forecast import ForecastOptions, forecast
from twin.live_state import load_live_inputs
from twin.plan import Reject, build_plan, prepare_catalog
from twin.policies import Policy
from twin.simulator import End, simulate
from twin.store import Job, Node
from twin.uncalibrated import FallbackModels
from twin.workload import RunningState, Workload

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def up_and_draining() -> Cluster:
    return Cluster((NodeSpec("a", A100, 8), NodeSpec("b", A100, 8, draining=True)))


def running_on_b_and_two_queued() -> Workload:
    # j0 runs on b (8 GPUs, 40 s of its 100 s left); j1 and j2 each need 8 GPUs for 50 s, queued at 0.
    workload = Workload.from_durations([-60.0, 0.0, 0.0], [100.0, 50.0, 50.0], gpus=8, gpu_model=A100)
    workload.running = {0: RunningState(elapsed_s=60.0, node_ids=("b",))}
    return workload


@pytest.mark.parametrize("policy", list(Policy))
def test_a_draining_node_finishes_its_job_and_takes_no_new_one(policy: Policy) -> None:
    cluster = up_and_draining()
    plan = build_plan(running_on_b_and_two_queued(), prepare_catalog([], None), cluster, None)
    result = simulate(cluster, plan, policy, record_placements=True)
    assert plan.reject.tolist() == [Reject.NONE] * 3
    assert (result.outcome == End.COMPLETED).all()
    # j0 on b to its end at 40 s; j1 and j2 one after the other on a, never on b, though b is free from 40.
    assert result.end_s.tolist() == [40.0, 50.0, 100.0]
    assert result.placements == [((1, 8),), ((0, 8),), ((0, 8),)]


def test_a_running_job_stays_on_its_nodes() -> None:
    """Two nodes up; the job runs on the second: the queued job that needs a whole node takes the first at
    once (best fit put the running job on the first, and the queued one waited for it)."""
    cluster = Cluster((NodeSpec("a", A100, 8), NodeSpec("b", A100, 8)))
    workload = Workload.from_durations([-10.0, 0.0], [100.0, 50.0], gpus=[4, 8], gpu_model=A100)
    workload.running = {0: RunningState(elapsed_s=10.0, node_ids=("b",))}
    plan = build_plan(workload, prepare_catalog([], None), cluster, None)
    result = simulate(cluster, plan, Policy.FIFO, record_placements=True)
    assert result.start_s.tolist() == [-10.0, 0.0]
    assert result.placements == [((1, 4),), ((0, 8),)]


def test_only_draining_gpus_of_a_type_serve_its_running_job_and_reject_new_ones() -> None:
    """Every H100 node drains: the H100 job running there runs on; a new H100 job has no capacity."""
    h100 = "NVIDIA-H100-80GB-HBM3"
    cluster = Cluster((NodeSpec("a", A100, 8), NodeSpec("h", h100, 8, draining=True)))
    workload = Workload.from_durations([-5.0, 0.0], [20.0, 20.0], gpus=8, gpu_model=h100)
    workload.running = {0: RunningState(elapsed_s=5.0, node_ids=("h",))}
    plan = build_plan(workload, prepare_catalog([], None), cluster, None)
    result = simulate(cluster, plan, Policy.FIFO)
    assert plan.reject.tolist() == [Reject.NONE, Reject.NO_CAPACITY]
    assert result.end_s[0] == 15.0
    assert cluster.gpus_by_model() == {A100: 8, h100: 0} and cluster.total_gpus == 8


def test_the_inventory_keeps_draining_nodes_and_leaves_down_ones_out() -> None:
    cluster = cluster_from_inventory([("a", A100, 8, "up"), ("b", A100, 8, "drain"), ("c", A100, 8, "down")])
    assert [(n.node_id, n.draining) for n in cluster.nodes] == [("a", False), ("b", True)]
    assert cluster.total_gpus == 8 and cluster.draining == 1


@pytest.fixture
def store(tmp_path: Path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'finetwin.db'}")
    migrate(engine)
    return engine


def test_the_live_state_keeps_jobs_on_draining_nodes_and_leaves_out_those_on_down_ones(store: Engine) -> None:
    config = {"model_name": "llama-3-8b", "method": "lora", "gpu_model": A100, "number_gpus": 8,
              "number_nodes": 1, "batch_size": 8, "tokens_per_sample": 2048}  # fmt: skip
    with session_scope(store) as session:
        for node_id, status in (("a", "up"), ("b", "drain"), ("c", "down")):
            session.add(Node(node_id=node_id, cluster_id="default", gpu_model=A100, gpu_count=8,
                             status=status, updated_at=NOW - timedelta(hours=1)))  # fmt: skip
        for job_id, node_id in (("on-b", "b"), ("on-c", "c")):
            session.add(Job(job_id=job_id, state="running", submitted_at=NOW - timedelta(minutes=20),
                            started_at=NOW - timedelta(minutes=10), node_ids=[node_id], updated_at=NOW,
                            **config))  # fmt: skip
    inputs = load_live_inputs(store, now=NOW)
    assert inputs.workload.job_ids == ["on-b"]
    assert inputs.workload.running[0].node_ids == ("b",)
    assert inputs.cluster.total_gpus == 8 and inputs.cluster.draining == 1
    assert any("1 node(s) draining" in note for note in inputs.notes), inputs.notes
    assert any("1 running job(s) left out: a node they ran on is down" in note for note in inputs.notes)
    document = forecast(inputs, FallbackModels(), ForecastOptions(horizon_s=3600.0, runs=2, workers=1))
    assert document["cluster"] == {"nodes": 2, "draining": 1, "gpus_by_model": {A100: 8}}
    assert document["summary"]["jobs_rejected"]["mean"] == 0  # the job on b runs on, where it runs


def test_a_running_job_that_names_a_node_twice_takes_no_more_than_it_holds() -> None:
    """16 GPUs "on" one 8-GPU node named twice: the node cannot hold it, so the job is placed as it fits
    (it took the node's 8 GPUs twice, and left the node at -8 free)."""
    from twin.policies import Placement

    placement = Placement(Cluster((NodeSpec("a", A100, 8), NodeSpec("b", A100, 8))))
    assert placement.take(((0, 8), (0, 8))) is False
    assert placement.free == [8, 8]
    assert placement.take(((0, 4), (1, 4))) is True and placement.free == [4, 4]
