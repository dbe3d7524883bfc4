"""Capacity planning on the local pool: the cheapest cluster against Erlang C, pairing of runs across
scenarios, the frontier, failing tasks, and `finetwin plan` on files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from finetwin.cli import main
from tests.twin.capacity_cases import FailingTask, mixed_sweep, narrowed
from tests.twin.conftest import A100
from twin.capacity import (
    SweepRequest,
    VaryRange,
    cheapest,
    mark_frontier,
    run_sweep,
    scenario_cluster,
    without_timings,
)
from twin.cluster import cluster_from_spec
from twin.executors import LocalExecutor
from twin.forecast import ForecastOptions, TwinInputs, forecast
from twin.plan import PlanOptions
from twin.slo_attainment import Slo, SloSet
from twin.workload import Workload, write_jobs_csv

MEAN_SERVICE_S = 100.0
OFFERED = 5.5  # Erlang load: arrival rate x mean service, in GPUs
GPUS_PER_NODE = 2


def erlang_c(servers: int, offered: float) -> float:
    """P(an arrival waits) in an M/M/c queue."""
    below = sum(offered**k / math.factorial(k) for k in range(servers))
    top = offered**servers / math.factorial(servers) * servers / (servers - offered)
    return top / (below + top)


def erlang_p95_wait(servers: int) -> float:
    """The 95th percentile of the wait: P(W > t) = C exp(-(c mu - lambda) t)."""
    if servers <= OFFERED:
        return math.inf
    waits = erlang_c(servers, OFFERED)
    mu = 1.0 / MEAN_SERVICE_S
    return 0.0 if waits <= 0.05 else math.log(waits / 0.05) / (servers * mu - OFFERED * mu)


def mmc_inputs(jobs: int = 4000, seed: int = 3) -> TwinInputs:
    """Single-GPU jobs, Poisson arrivals, exponential durations fixed in the workload (an M/M/c queue)."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(MEAN_SERVICE_S / OFFERED, jobs))
    service = rng.exponential(MEAN_SERVICE_S, jobs)
    base = cluster_from_spec({"nodes": [{"gpu_model": A100, "count": 1, "gpus_per_node": GPUS_PER_NODE}]})
    return TwinInputs(cluster=base, workload=Workload.from_durations(arrival, service))


@pytest.mark.parametrize("bound_s", [200.0, 20.0])
def test_the_cheapest_cluster_is_the_one_erlang_c_names(bound_s: float) -> None:
    nodes = range(1, 8)
    expected = min(n for n in nodes if erlang_p95_wait(n * GPUS_PER_NODE) <= bound_s)
    request = SweepRequest(vary=[f"{A100}=1..7"], runs=2, horizon=None, confidence=0.9)
    slos = SloSet(slos=[Slo(name="p95 wait", metric="wait_p95_s", max=bound_s)])
    doc = run_sweep(mmc_inputs(), None, request, slos, LocalExecutor(1))
    assert doc["cheapest"] is not None
    assert doc["cheapest"]["nodes"] == {A100: expected}
    assert doc["cheapest"]["gpu_hours_per_day"] == expected * GPUS_PER_NODE * 24
    # Every smaller cluster misses, every larger one meets: the answer is not an accident of the ranking.
    for row in doc["scenarios"]:
        assert row["meets_slos"] == (row["nodes"][A100] >= expected)


def test_the_answer_does_not_depend_on_pool_size_or_chunking() -> None:
    inputs, models, request, slos = mixed_sweep()
    one = run_sweep(inputs, models, request, slos, LocalExecutor(1))
    two = run_sweep(inputs, models, narrowed(request, chunk_runs=1), slos, LocalExecutor(2))
    assert len(one["scenarios"]) == 24 and one["tasks"] == 48 and two["tasks"] == 96
    assert json.dumps(one["scenarios"]) == json.dumps(two["scenarios"])
    assert one["cheapest"] == two["cheapest"]


def test_a_scenario_runs_the_forecasts_runs_so_scenarios_are_paired() -> None:
    """Run i of every scenario is run i of a forecast with the sweep's seed: the same arrivals and per-job
    draws whatever the cluster (common random numbers)."""
    inputs, models, request, slos = mixed_sweep()
    doc = run_sweep(inputs, models, request, slos, LocalExecutor(1))
    row = doc["scenarios"][5]
    nodes = tuple(sorted(row["nodes"].items()))
    scenario_inputs = TwinInputs(scenario_cluster(inputs.cluster, nodes), inputs.workload, inputs.arrivals)
    options = ForecastOptions(
        horizon_s=request.horizon_s,
        interval_s=request.interval_s,
        runs=request.runs,
        seed=request.seed,
        policy=row["policy"],
        plan=PlanOptions(admission=row["admission"]),
        workers=1,
    )
    expected = forecast(scenario_inputs, models, options, slos)
    for slo in expected["slos"]:
        assert row["slos"][slo["name"]]["attainment"] == slo["attainment"]
        assert row["slos"][slo["name"]]["met_share"] == slo["probability_met"]


def test_the_frontier_and_the_cheapest_by_gpu_hours_then_energy() -> None:
    def row(gpu_hours: float, energy: float, shares: list[float], meets: bool) -> dict:
        return {
            "gpu_hours_per_day": gpu_hours,
            "energy_kwh_per_day": energy,
            "slos": {f"s{k}": {"met_share": s} for k, s in enumerate(shares)},
            "meets_slos": meets,
        }

    rows = [
        row(100, 50, [0.5, 1.0], False),  # cheapest, weakest SLO at 0.5: frontier
        row(200, 90, [0.95, 1.0], True),  # meets; same cost as the next but more energy
        row(200, 80, [0.95, 1.0], True),  # meets, less energy: the cheapest
        row(300, 70, [0.95, 0.99], True),  # dearer and no better: off the frontier
        row(400, 90, [1.0, 1.0], True),  # dearer but better: frontier
    ]
    rows.append(row(150, 60, [0.4, 1.0], False) | {"error": "failed"})
    # The cheapest of all, but a tenth of its jobs fit on no node: it serves no workload, so no trade-off.
    rows.append(row(50, 20, [1.0, 1.0], False) | {"unplaceable_share": 0.1})
    mark_frontier(rows)
    assert [r["frontier"] for r in rows] == [True, False, True, False, True, False, False]
    assert cheapest(rows) is rows[2]
    assert cheapest([rows[0]]) is None


def test_a_failing_task_is_retried_and_a_broken_scenario_reported(tmp_path: Path) -> None:
    inputs, models, request, slos = mixed_sweep()
    request = narrowed(request, vary=[f"{A100}=1..2", "L40S=0..1"], admissions=["off"], runs=2)
    clean = run_sweep(inputs, models, request, slos, LocalExecutor(2))
    flaky = FailingTask(str(tmp_path), flaky=True)
    retried = run_sweep(inputs, models, request, slos, LocalExecutor(2), task_fn=flaky)
    assert len(list(tmp_path.iterdir())) == retried["tasks"]  # every task failed once ...
    assert without_timings(retried) == without_timings(clean)  # ... and was retried to the same answer

    broken = FailingTask(str(tmp_path), broken=2)
    doc = run_sweep(inputs, models, request, slos, LocalExecutor(2), task_fn=broken)
    assert [f["scenario"] for f in doc["failed"]] == [2]
    assert "broken on purpose" in doc["failed"][0]["error"] and "2 times" in doc["failed"][0]["error"]
    assert "error" in doc["scenarios"][2] and not doc["scenarios"][2]["meets_slos"]
    others = [k for k in range(len(doc["scenarios"])) if k != 2]
    assert [doc["scenarios"][k]["slos"] for k in others] == [clean["scenarios"][k]["slos"] for k in others]


def test_in_process_the_same_retry_and_report(tmp_path: Path) -> None:
    inputs, models, request, slos = mixed_sweep()
    request = narrowed(request, vary=[f"{A100}=2..2", "L40S=1..1"], admissions=["off"], runs=2)
    clean = run_sweep(inputs, models, request, slos, LocalExecutor(1))
    retried = run_sweep(
        inputs, models, request, slos, LocalExecutor(1), task_fn=FailingTask(str(tmp_path), flaky=True)
    )
    assert without_timings(retried) == without_timings(clean)
    broken = run_sweep(
        inputs, models, request, slos, LocalExecutor(1), task_fn=FailingTask(str(tmp_path), broken=1)
    )
    assert [f["scenario"] for f in broken["failed"]] == [1] and broken["scenarios"][0] == clean["scenarios"][
        0
    ]


def test_a_worker_that_dies_does_not_hang_the_sweep(tmp_path: Path) -> None:
    inputs, models, request, slos = mixed_sweep()
    request = narrowed(request, vary=[f"{A100}=1..1"], runs=2, admissions=["off"])
    doc = run_sweep(
        inputs,
        models,
        request,
        slos,
        LocalExecutor(2),
        task_fn=FailingTask(str(tmp_path), broken=0, die=True),
    )
    assert 0 in [f["scenario"] for f in doc["failed"]]
    assert "died" in doc["failed"][0]["error"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NVIDIA-A100-SXM4-80GB=1..6", (A100, 1, 6)),
        ("A100-SXM = 2", (A100, 2, 2)),
        ("L40S=0..4", ("L40S", 0, 4)),
    ],
)
def test_vary_ranges_are_read_from_text(text: str, expected: tuple[str, int, int]) -> None:
    vary = VaryRange.model_validate(text)
    assert (vary.gpu_model, vary.min, vary.max) == expected


@pytest.mark.parametrize("text", ["A100", "A100=5..2", "=1..2", "A100=-1..2", "A100-SMX=1..3"])
def test_bad_vary_ranges_are_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        VaryRange.model_validate(text)


def test_a_node_count_of_thousands_of_digits_is_refused_by_its_bound() -> None:
    """int() refused it first, with Python's own words ("use sys.set_int_max_str_digits()")."""
    with pytest.raises(ValidationError) as raised:
        VaryRange.model_validate("L40S=" + "9" * 5000)
    assert "at most 100,000 nodes" in str(raised.value) and "set_int_max_str_digits" not in str(raised.value)


def test_a_misspelled_gpu_type_is_refused_with_the_closest_names() -> None:
    """It was planned as a phantom pool no job asks for: "no scenario meets the SLOs"."""
    with pytest.raises(ValidationError, match=r"unknown GPU model 'A100-SMX'; did you mean '.*A100-SXM"):
        VaryRange.model_validate("A100-SMX=1..3")


CLUSTER = f"nodes:\n  - {{gpu_model: {A100}, count: 1, gpus_per_node: {GPUS_PER_NODE}}}\n"
SLO = "slos:\n  - {name: p95 wait under 200 s, metric: wait_p95_s, max: 200}\n"


@pytest.fixture
def plan_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, Path]:
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("FINETWIN_RAY_ADDRESS", raising=False)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "slo.yaml").write_text(SLO)
    write_jobs_csv(mmc_inputs(jobs=1500).workload, tmp_path / "jobs.csv")
    return tmp_path / "cluster.yaml", tmp_path / "jobs.csv", tmp_path / "slo.yaml"


def plan_argv(files: tuple[Path, Path, Path], *extra: str) -> list[str]:
    cluster, jobs, slo = files
    return ["plan", "--cluster", str(cluster), "--workload", str(jobs), "--slo", str(slo),
            "--vary", f"{A100}=2..5", "--policy", "fifo,backfill", "--runs", "2", *extra]  # fmt: skip


def test_plan_command_prints_the_json_of_the_issue(
    plan_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(plan_argv(plan_files, "--workers", "1", "--json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["executor"] == "local" and doc["tasks"] == 8
    scenario_keys = {"nodes", "policy", "admission", "slos", "meets_slos", "gpu_hours_per_day",
                     "energy_kwh_per_day", "frontier", "unplaceable_share"}  # fmt: skip
    for row in doc["scenarios"]:
        assert set(row) == scenario_keys
        assert set(row["slos"]["p95 wait under 200 s"]) == {"attainment", "met_share"}
        assert set(row["slos"]["p95 wait under 200 s"]["attainment"]) == {"mean", "p10", "p90"}
    assert [(r["nodes"][A100], r["policy"]) for r in doc["scenarios"]] == [
        (n, p) for n in range(2, 6) for p in ("fifo", "backfill")
    ]
    assert doc["cheapest"] in doc["scenarios"] and doc["cheapest"]["frontier"]


def test_plan_command_table_and_bad_input(
    plan_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(plan_argv(plan_files, "--workers", "1")) == 0
    out = capsys.readouterr().out
    assert "cheapest:" in out and "* = frontier" in out
    assert main(plan_argv(plan_files, "--vary", "L40S=3..1")) == 2
    assert "empty" in capsys.readouterr().err
    assert main(plan_argv(plan_files, "--policy", "lifo")) == 2
    assert "policies" in capsys.readouterr().err
    cluster, _jobs, slo = plan_files
    assert main(["plan", "--workload", str(_jobs), "--vary", f"{A100}=1..2"]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_plan_command_on_the_live_arrival_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --workload: the store's queue and observed arrivals, over the forecast horizon."""
    from finetwin.schema import migrate
    from tests.advisor.seed import seed_overloaded_cluster
    from twin.db import make_engine

    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    migrate(engine)
    seed_overloaded_cluster(engine, jobs=4)  # one 8-GPU node, one job running and three queued
    engine.dispose()
    monkeypatch.setenv("FINETWIN_DATABASE_URL", url)
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "no-models"))
    monkeypatch.delenv("FINETWIN_RAY_ADDRESS", raising=False)
    # Four submissions over ten years of history: the arrival process is there but (nearly) silent, so
    # the answer does not hang on whether a job happens to arrive (nor on the time of day).
    monkeypatch.setenv("FINETWIN_FORECAST_LOOKBACK_DAYS", "3650")
    slo = tmp_path / "slo.yaml"
    slo.write_text("slos:\n  - {name: p95 wait under 1 h, metric: wait_p95_s, max: 3600}\n")
    argv = ["plan", "--slo", str(slo), "--vary", f"{A100}=1..4", "--runs", "2", "--horizon", "12h",
            "--workers", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["horizon_s"] == 12 * 3600.0 and len(doc["scenarios"]) == 4
    meets = [row["meets_slos"] for row in doc["scenarios"]]
    # Four jobs of a whole node each, the queued ones waiting for up to half an hour already: only a
    # cluster that starts them all at once keeps the p95 wait under an hour.
    assert meets == [False, False, False, True]
    assert doc["cheapest"]["nodes"] == {A100: 4}


def test_an_unreachable_ray_address_is_a_clear_error_not_a_hang(
    plan_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ingest.broker import free_port

    pytest.importorskip("ray")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert main(plan_argv(plan_files, "--ray", address)) == 2
    assert f"cannot reach the Ray cluster at {address}" in capsys.readouterr().err
    monkeypatch.setenv("FINETWIN_RAY_ADDRESS", address)  # the ensembles of the other commands too
    cluster, jobs, _slo = plan_files
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--runs", "2"]) == 2
    assert "cannot reach the Ray cluster" in capsys.readouterr().err


def test_the_plan_table_says_what_its_cells_are_and_which_jobs_fit_nowhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The SLO cells read "0.24 [0.0833,0.333] 0%" without a legend, and a scenario that could not place a
    quarter of its jobs read "no" without a reason."""
    from finetwin.commands.plan import _print_plan

    def scenario(nodes: int, unplaceable: float) -> dict:
        return {"nodes": {A100: nodes}, "policy": "fifo", "admission": "off", "frontier": unplaceable == 0,
                "slos": {"wait": {"attainment": {"mean": 0.9, "p10": 0.8, "p90": 1.0}, "met_share": 0.75}},
                "gpu_hours_per_day": 8.0 * nodes, "energy_kwh_per_day": 3.0 * nodes,
                "meets_slos": unplaceable == 0, "unplaceable_share": unplaceable}  # fmt: skip

    doc = {"scenarios": [scenario(1, 0.25), scenario(2, 0.0)], "runs": 4, "tasks": 8, "executor": "local",
           "confidence": 0.9, "slos": ["wait"], "cheapest": None, "failed": []}  # fmt: skip
    _print_plan(doc)
    out = capsys.readouterr().out
    assert "each SLO: attainment, mean [p10,p90] over the runs, then the share of runs that met it" in out
    assert "unplaced" in out and "25%" in out
    doc["scenarios"] = [scenario(2, 0.0)]
    _print_plan(doc)
    assert "unplaced" not in capsys.readouterr().out  # only where some scenario leaves jobs unplaced
