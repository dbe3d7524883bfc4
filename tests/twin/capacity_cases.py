"""Shared sweeps for the capacity-planning tests (local and Ray), and a task that fails on purpose."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.twin.conftest import A100, L40S, RuleModels, config_workload
from twin.arrivals import ArrivalModel
from twin.capacity import RunFigures, SweepInputs, SweepRequest, SweepTask, run_sweep_task
from twin.cluster import cluster_from_spec
from twin.forecast import TwinInputs
from twin.slo_attainment import Slo, SloSet


def narrowed(request: SweepRequest, **changes: object) -> SweepRequest:
    """The request with some fields changed, validated again (model_copy would skip the validation)."""
    return SweepRequest.model_validate(request.model_dump() | changes)


def mixed_sweep() -> tuple[TwinInputs, RuleModels, SweepRequest, SloSet]:
    """24 scenarios (A100 1..3 nodes x L40S 0..1 x fifo/backfill x admission off/repair) on known jobs plus
    a live-like arrival process, with runtime failures: every run differs, so pairing matters."""
    rng = np.random.default_rng(7)
    base = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 1}, {"gpu_model": L40S, "count": 1}]})
    known = config_workload(rng, 20, 1800.0, gpu_choices=(1, 2, 4, 8))
    mix = config_workload(rng, 15, 1.0, gpu_choices=(1, 2, 4, 8))
    for jobs in (known, mix):
        jobs.work_tokens /= 10.0  # minutes to an hour per job at RuleModels' speed
    arrivals = ArrivalModel(hourly_rate=np.full(24, 8.0), mix=mix)
    inputs = TwinInputs(cluster=base, workload=known, arrivals=arrivals)
    request = SweepRequest(
        vary=[f"{A100}=1..3", f"{L40S}=0..1"],
        policies=["fifo", "backfill"],
        admissions=["off", "repair"],
        runs=4,
        seed=11,
        horizon="6h",
        interval="1h",
        chunk_runs=2,
    )
    slos = SloSet(
        slos=[
            Slo(name="p95 wait <= 30 min", metric="wait_p95_s", max=1800.0),
            Slo(name="failures <= 20 %", metric="runtime_failure_ratio", max=0.2),
        ]
    )
    return inputs, RuleModels(p_fail_valid=0.5), request, slos


@dataclass(frozen=True)
class FailingTask:
    """A task function that fails on purpose: every task's first attempt when `flaky` (it leaves a marker
    file, so the retry finds it and succeeds), and every attempt for scenario `broken` (by raising, or by
    killing its worker process when `die`)."""

    marker_dir: str
    flaky: bool = False
    broken: int | None = None
    die: bool = False

    def __call__(self, shared: SweepInputs, task: SweepTask) -> list[RunFigures]:
        if task.scenario == self.broken:
            if self.die:
                os._exit(3)
            raise RuntimeError(f"scenario {task.scenario} is broken on purpose")
        if self.flaky:
            marker = Path(self.marker_dir) / f"{task.scenario}-{task.first}"
            if not marker.exists():
                marker.write_text("failed once")
                raise RuntimeError("first attempt fails on purpose")
        return run_sweep_task(shared, task)
