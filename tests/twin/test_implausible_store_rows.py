"""Rows stored before telemetry bounded them do not stop forecasting (the probe's D1 and D2), on SQLite and
PostgreSQL: an observed run of 1e200 s at 1e200 tokens/s overflowed PostgreSQL's product of the two (every
forecast and what-if failed) and made SQLite's inf ("assumed inf tokens"); a node of 2^31 - 1 GPUs made every
forecast allocate per GPU until memory ran out."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from twin.cluster import MAX_GPUS_PER_NODE, cluster_from_inventory, oversized_nodes
from twin.db import session_scope
from twin.forecast import ForecastOptions, forecast
from twin.live_state import NoClusterError, load_live_inputs
from twin.store import Job, Node, ObservedRun
from twin.uncalibrated import FallbackModels

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
HUGE = 2**31 - 1  # the largest the store's integer column holds, and what the probe sent
OPTIONS = ForecastOptions(horizon_s=2 * 3600.0, runs=2, workers=1)


def job(job_id: str, state: str, submitted: datetime, **fields: object) -> Job:
    config = {"model_name": "llama3-8b", "method": "lora", "gpu_model": A100, "number_gpus": 2,
              "number_nodes": 1, "batch_size": 16, "tokens_per_sample": 1024}  # fmt: skip
    return Job(job_id=job_id, state=state, submitted_at=submitted, updated_at=submitted, **(config | fields))


def node(node_id: str, gpus: int, status: str = "up") -> Node:
    return Node(node_id=node_id, gpu_model=A100, gpu_count=gpus, status=status, updated_at=NOW)


def test_an_observed_run_whose_work_overflows_does_not_stop_the_forecast(engine: Engine) -> None:
    with session_scope(engine) as session:
        session.add(node("n0", 8))
        ended = NOW - timedelta(hours=1)
        for job_id, runtime, rate in (("huge", 1e200, 1e200), ("fine-1", 100.0, 1e3), ("fine-2", 100.0, 3e3)):
            session.add(job(job_id, "completed", ended - timedelta(hours=1), ended_at=ended))
            session.flush()
            session.add(ObservedRun(job_id=job_id, is_valid=1, observed_at=ended, train_runtime=runtime,
                                    dataset_tokens_per_second=rate))  # fmt: skip
        session.add(job("queued", "submitted", NOW - timedelta(minutes=5)))  # declares no work
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=1))  # PostgreSQL: DataError (overflow)
    # The overflowing run is no work at all; the queued job takes the median of the two that are finite.
    assert any("assumed 200,000 tokens" in note for note in inputs.notes), inputs.notes
    assert not any("inf" in note for note in inputs.notes)
    assert bool(math.isfinite(inputs.workload.work_tokens.max()))
    doc = forecast(inputs, FallbackModels(), OPTIONS)
    assert doc["summary"]["jobs"]["mean"] >= 1


def test_a_node_with_more_gpus_than_a_node_holds_is_left_out_with_a_note(engine: Engine) -> None:
    with session_scope(engine) as session:
        session.add_all([node("n0", 8), node("big", HUGE), node("big-but-down", HUGE, "down")])
        session.add(job("queued", "submitted", NOW - timedelta(minutes=5), dataset_tokens=2e7))
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=1))
    assert inputs.cluster.gpus_by_model() == {A100: 8}
    [note] = [note for note in inputs.notes if "left out" in note and "GPUs" in note]
    assert f"more than {MAX_GPUS_PER_NODE} GPUs" in note and "'big' (2,147,483,647 GPUs)" in note
    assert "big-but-down" not in note  # not in the cluster either way
    doc = forecast(inputs, FallbackModels(), OPTIONS)  # allocated per GPU of the largest node: out of memory
    assert doc["summary"]["utilization_by_type"][A100]["mean"] > 0


def test_a_cluster_of_only_oversized_nodes_says_why_it_is_empty(engine: Engine) -> None:
    with session_scope(engine) as session:
        session.add(node("big", MAX_GPUS_PER_NODE + 1))
    with pytest.raises(NoClusterError, match=r"no node .* is up .*1 node\(s\) up left out: they report more"):
        load_live_inputs(engine, now=NOW)


def test_the_inventory_keeps_nodes_up_to_the_bound() -> None:
    rows = [
        ("a", A100, MAX_GPUS_PER_NODE, "up"), ("b", A100, MAX_GPUS_PER_NODE + 1, "up"),
        ("c", A100, HUGE, "drain"), ("d", A100, 0, "up"),
    ]  # fmt: skip
    assert [n.node_id for n in cluster_from_inventory(rows).nodes] == ["a"]
    # A draining node serves its running jobs, so it is bounded as a node that is up.
    assert oversized_nodes(rows) == [("b", MAX_GPUS_PER_NODE + 1), ("c", HUGE)]


def test_power_stored_before_it_was_bounded_leaves_energy_finite(engine: Engine) -> None:
    """A progress report of 1e308 W a GPU and an observed run of 1e308 W, stored before ingest bounded power,
    made an interval's recorded energy and the forecast's energy inf or NaN, and dropped energy from the
    skill report without a word. The twin now reads such a power as none, and assumes one."""
    from twin.actuals import actual_series, load_job_times

    with session_scope(engine) as session:
        session.add(node("n0", 8))
        ended = NOW - timedelta(minutes=30)
        session.add(job("done", "completed", NOW - timedelta(hours=2), started_at=NOW - timedelta(hours=2),
                        ended_at=ended, last_power_watts=1e308))  # fmt: skip
        session.flush()
        session.add(ObservedRun(job_id="done", is_valid=1, observed_at=ended, train_runtime=5400.0,
                                dataset_tokens_per_second=1e3, gpu_power_watts_avg=1e308))  # fmt: skip
        session.add(job("running", "running", NOW - timedelta(hours=1), started_at=NOW - timedelta(hours=1),
                        last_power_watts=1e308, dataset_tokens=2e12))  # fmt: skip
    times = load_job_times(engine, "default", NOW - timedelta(hours=3), NOW)
    energy = actual_series(times, [0.0, 3600.0, 7200.0, 10800.0])["energy_kwh"]
    assert all(math.isfinite(e) for e in energy) and energy.sum() > 0
    # Two A100s at 75 % of their 400 W board power, for 1.5 h and 1 h: 2.25 kWh.
    assert energy.sum() == pytest.approx(2 * 400 * 0.75 * 2.5 / 1000)
    inputs = load_live_inputs(engine, now=NOW, lookback=timedelta(days=1))
    assert inputs.workload.running[0].power_w is None
    doc = forecast(inputs, FallbackModels(), OPTIONS)
    assert math.isfinite(doc["summary"]["energy_kwh"]["mean"]) and doc["summary"]["energy_kwh"]["mean"] > 0
