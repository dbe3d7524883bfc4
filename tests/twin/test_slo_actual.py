"""SLO attainment as it happened, judged per interval on the store's record by the definitions a forecast's
runs are judged by (twin.slo_actual): hand-made jobs, hand-computed figures."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from twin.actuals import JobTimes
from twin.gpus_up import GpusUp, NodeReport, gpus_up_from_reports
from twin.slo_actual import actual_slo_series, attainment_as_it_happened
from twin.slo_attainment import Slo, SloSet

A100 = "NVIDIA-A100-SXM4-80GB"
NAN = float("nan")
H = 3600.0
EDGES = [0.0, H, 2 * H, 3 * H]
#        submitted  started  ended   state       the job
JOBS = [(-1800.0,   0.0,     NAN,    "running"),   # a: waited 30 min, started at the window's start
        (600.0,     NAN,     NAN,    "submitted"),  # b: waits the whole window
        (4000.0,    5000.0,  NAN,    "running"),   # c: waited 1000 s, in the second hour
        (-9000.0,   -100.0,  NAN,    "running"),   # d: started before the window: none of its waits
        (100.0,     NAN,     100.0,  "rejected"),  # e: rejected: never queued
        (200.0,     300.0,   2000.0, "failed"),    # f: waited 100 s, failed at run time
        (0.0,       100.0,   3000.0, "completed"),  # g: waited 100 s
        (0.0,       NAN,     1000.0, "completed")]  # h: start not recorded: no wait past its end  # fmt: skip


def eight_a100s_up(origin: datetime) -> GpusUp:
    """One node of 8 A100s, up since long before the window."""
    up_before = NodeReport("n0", origin - timedelta(days=30), "up", 8, A100)
    return gpus_up_from_reports([], origin, {"n0": up_before})


def job_times() -> JobTimes:
    submitted, started, ended = (np.array([job[k] for job in JOBS]) for k in range(3))
    states = [job[3] for job in JOBS]
    n = len(JOBS)
    origin = datetime(2026, 3, 1, tzinfo=UTC)
    return JobTimes(
        origin=origin, submitted=submitted, started=started, ended=ended,
        gpus=np.full(n, 1.0), gpu_models=[A100] * n, power_w=np.full(n, 300.0),
        completed=np.array([s == "completed" for s in states]),
        failed=np.array([s == "failed" for s in states]),
        rejected=np.array([s == "rejected" for s in states]), gpus_up=eight_a100s_up(origin),
    )  # fmt: skip


def test_waits_count_the_jobs_started_and_the_jobs_still_waiting_as_a_forecast_does() -> None:
    series = actual_slo_series(job_times(), EDGES)
    # Hour 1: a, f, g started (1800, 100, 100 s), b waits 3000 s at its end; hour 2: c started (1000 s), b
    # waits 6600 s; hour 3: only b, 10200 s.
    waits = [[1800.0, 100.0, 100.0, 3000.0], [1000.0, 6600.0], [10200.0]]
    np.testing.assert_allclose(series["wait_p95_s"], [np.quantile(w, 0.95) for w in waits])
    np.testing.assert_allclose(series["wait_p50_s"], [np.quantile(w, 0.5) for w in waits])
    np.testing.assert_allclose(series["runtime_failure_ratio"], [1 / 3, NAN, NAN])


def test_each_slo_says_per_interval_whether_it_held_and_its_share_of_the_intervals_with_data() -> None:
    slos = SloSet(slos=[
        Slo(name="wait", metric="wait_p95_s", max=H),
        Slo(name="failures", metric="runtime_failure_ratio", max=0.1),
        Slo(name="busy", metric="utilization", min=0.35, gpu_model=A100),
        Slo(name="h100 busy", metric="utilization", min=0.2, gpu_model="NVIDIA-H100-PCIe"),
    ])  # fmt: skip
    said = {
        s["name"]: s for s in attainment_as_it_happened(slos, actual_slo_series(job_times(), EDGES), EDGES)
    }
    wait = said["wait"]
    assert wait["held"] == [True, False, False] and wait["attainment"] == pytest.approx(1 / 3)
    assert wait["judged"] == 3 and wait["values"][2] == pytest.approx(10200.0)
    failures = said["failures"]
    assert (
        failures["held"] == [False, None, None] and failures["attainment"] == 0.0 and failures["judged"] == 1
    )
    # GPU-seconds held of the 8 A100s: hour 1 a 3600 + d 3600 + f 1700 + g 2900; hour 2 a, d and c from
    # 5000 s (2200); hour 3 a, c, d.
    busy = said["busy"]
    np.testing.assert_allclose(busy["values"], np.array([11800.0, 9400.0, 10800.0]) / (8 * H))
    assert busy["held"] == [True, False, True] and busy["attainment"] == pytest.approx(2 / 3)
    # A GPU type with no node up: no data, said as none (not as missed).
    assert said["h100 busy"]["attainment"] is None and said["h100 busy"]["held"] == [None] * 3


def test_intervals_before_the_telemetry_began_have_no_data() -> None:
    slos = SloSet(slos=[Slo(name="busy", metric="utilization", min=0.35)])
    said = attainment_as_it_happened(slos, actual_slo_series(job_times(), EDGES), EDGES, record_from_s=H)[0]
    assert said["held"] == [None, False, True] and said["attainment"] == 0.5 and said["judged"] == 2
