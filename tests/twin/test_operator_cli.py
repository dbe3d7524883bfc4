"""The twin's commands as an operator meets them: a misspelled GPU is refused with the closest names
(cluster YAML, what-if changes), the SLOs declared through the API are the ones the CLI uses, and tables
speak hours and percent (full precision stays in --json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetwin.cli import main

CLUSTER = "nodes:\n  - {gpu_model: A100-SXM, count: 1, gpus_per_node: 8}\n"
JOBS = "job_id,arrival_s,gpus,duration_s\nj1,0,4,7200\nj2,10,8,5400\nj3,20,2,30\n"


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "no-models"))
    monkeypatch.delenv("FINETWIN_DATABASE_URL", raising=False)
    monkeypatch.delenv("FINETWIN_SLO_FILE", raising=False)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_misspelled_gpu_in_a_cluster_file_is_refused_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write(tmp_path, "c.yaml", "nodes:\n  - {gpu_model: NVIDIA-A100-SXM4-80G, count: 2}\n")
    jobs = write(tmp_path, "jobs.csv", JOBS)
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    error = capsys.readouterr().err
    assert "nodes[0].gpu_model: unknown GPU model 'NVIDIA-A100-SXM4-80G'" in error, error
    assert "did you mean 'NVIDIA-A100-SXM4-80GB'" in error


def test_a_cluster_file_takes_gpu_names_as_nvidia_smi_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`NVIDIA A100-SXM4-80GB` is what nvidia-smi prints; `A100` alone stays ambiguous and refused, with
    every A100 of the catalogue as a suggestion (not the A10, which is spelled alike)."""
    jobs = write(tmp_path, "jobs.csv", JOBS)
    results = []
    for name in ("NVIDIA-A100-SXM4-80GB", "NVIDIA A100-SXM4-80GB", "a100_sxm4_80gb"):
        cluster = write(tmp_path, "c.yaml", f"nodes:\n  - {{gpu_model: {name}, count: 1}}\n")
        assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        results.append({k: v for k, v in result.items() if k not in ("generated_at", "wall_s")})
    assert results[1] == results[0] and results[2] == results[0]
    cluster = write(tmp_path, "c.yaml", "nodes:\n  - {gpu_model: A100, count: 1}\n")
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    error = capsys.readouterr().err
    a100s = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe")
    a100s += ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")
    members = " or ".join(repr(name) for name in a100s)
    assert f"unknown GPU model 'A100'; did you mean {members}?" in error, error


def test_a_misspelled_gpu_in_a_whatif_is_refused_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "cluster.yaml", CLUSTER)
    write(tmp_path, "jobs.csv", JOBS)
    scenario = write(
        tmp_path, "s.yaml",
        "runs: 2\ncluster: cluster.yaml\nworkload: jobs.csv\nchanges:\n"
        "  nodes: [{gpu_model: L40X, add: 1}]\n",
    )  # fmt: skip
    assert main(["whatif", str(scenario)]) == 2
    error = capsys.readouterr().err
    assert "changes.nodes.0.gpu_model" in error and "unknown GPU model 'L40X'" in error, error
    assert "did you mean 'NVIDIA-L40' or 'L40S'" in error


def test_an_unknown_key_in_a_whatif_is_named_with_the_key_it_resembles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = write(tmp_path, "s.yaml", "name: x\nrun: 2\n")
    assert main(["whatif", str(scenario)]) == 2
    assert "unknown key 'run' (did you mean 'runs'?)" in capsys.readouterr().err


def test_an_unknown_key_inside_a_section_is_matched_against_that_sections_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The suggestion and the list of keys come from the section the key sits in, not from the top level
    (`changes.nodez` was offered "name, horizon, runs, ..."); the scenario's file keys count at the top."""
    nested = write(tmp_path, "s.yaml", "changes:\n  nodez: [{gpu_model: L40S, add: 1}]\n")
    assert main(["whatif", str(nested)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "unknown key 'changes.nodez' (did you mean 'nodes'?)" in error, error
    known = "nodes, policy, admission, optimizations, right_size_batches, cancel_jobs"
    assert f"(known keys of changes: {known})" in error
    top = write(tmp_path, "t.yaml", "clustr: c.yaml\n")
    assert main(["whatif", str(top)]) == 2
    assert "unknown key 'clustr' (did you mean 'cluster'?)" in capsys.readouterr().err


def test_an_slo_file_with_an_unknown_key_is_refused_with_the_key_it_resembles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, jobs = write(tmp_path, "c.yaml", CLUSTER), write(tmp_path, "jobs.csv", JOBS)
    slos = write(tmp_path, "slo.yaml", "slos:\n  - {name: fast, metric: wait_p95_s, maxx: 1800}\n")
    argv = ["plan", "--cluster", str(cluster), "--workload", str(jobs), "--slo", str(slos),
            "--vary", "A100-SXM=1..2", "--runs", "2"]  # fmt: skip
    assert main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "unknown key 'slos.0.maxx' (did you mean 'max'?)" in error, error
    assert "known keys of slos: name, metric, max, min, gpu_model" in error
    # An empty file, or a lone value, was said as pydantic's "a valid dictionary or instance of SloSet".
    for text in ("", "# nothing declared yet\n", "fast\n"):
        write(tmp_path, "slo.yaml", text)
        assert main(argv) == 2
        error = " ".join(capsys.readouterr().err.split())
        assert f"{slos}: expected a mapping with an 'slos' list (or that list alone)" in error, error


def test_tables_speak_hours_and_percent_json_keeps_full_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, jobs = write(tmp_path, "c.yaml", CLUSTER), write(tmp_path, "jobs.csv", JOBS)
    argv = ["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--runs", "2"]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    text = capsys.readouterr().out
    makespan = doc["summary"]["makespan_s"]["mean"]
    assert makespan > 3600
    assert f"{makespan / 3600:.3g} h" in text  # not "12,610"
    # The rows say the figure and leave the unit to the cells: "makespan_s" over a cell in hours misled.
    rows = {line.split("  ")[0].strip() for line in text.splitlines()}
    assert "makespan" in rows and "wait mean" in rows and not any(row.endswith("_s") for row in rows), rows
    utilization = doc["summary"]["utilization"]["mean"]
    assert f"{100 * utilization:.1f} %" in text
    assert "attained in" in text and "% of intervals" in text


def test_the_cli_uses_the_slos_declared_through_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from advisor.slos_in_force import declare_slos
    from finetwin.schema import migrate
    from twin.db import make_engine
    from twin.slo_attainment import Slo, SloSet

    cluster, jobs = write(tmp_path, "c.yaml", CLUSTER), write(tmp_path, "jobs.csv", JOBS)
    argv = ["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--runs", "1", "--json"]
    assert main(argv) == 0
    before = {s["name"] for s in json.loads(capsys.readouterr().out)["slos"]}
    assert "runtime failures ≤ 10 %" in before  # the defaults: nothing declared yet
    (tmp_path / "data").mkdir()
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'finetwin.db'}")
    migrate(engine)
    declared = SloSet(slos=[Slo(name="runtime failures ≤ 5 %", metric="runtime_failure_ratio", max=0.05)])
    declare_slos(engine, declared, cluster_id="default", actor="test")
    engine.dispose()
    slo_file = write(
        tmp_path, "slos.yaml", "slos:\n  - {name: from the file, metric: utilization, min: 0.5}\n"
    )
    assert main(argv) == 0
    after = {s["name"] for s in json.loads(capsys.readouterr().out)["slos"]}
    assert after == {"runtime failures ≤ 5 %"}
    # The store comes first, the file only when the API declared nothing.
    monkeypatch.setenv("FINETWIN_SLO_FILE", str(slo_file))
    assert main(argv) == 0
    assert {s["name"] for s in json.loads(capsys.readouterr().out)["slos"]} == {"runtime failures ≤ 5 %"}
    # And a capacity plan without --slo: it read the file, and planned against SLOs not in force.
    plan = ["plan", "--cluster", str(cluster), "--workload", str(jobs), "--vary", "A100-SXM=1..2",
            "--runs", "2", "--json"]  # fmt: skip
    assert main(plan) == 0
    assert json.loads(capsys.readouterr().out)["slos"] == ["runtime failures ≤ 5 %"]


def test_steering_proposes_no_nodes_of_a_type_the_catalogue_lacks() -> None:
    """The what-if refuses unknown GPU names, so steering must not propose adding nodes of a type that only
    telemetry knows (it would fail every run); the known types still get their candidates."""
    from advisor.steering import candidates
    from twin.cluster import Cluster, NodeSpec
    from twin.forecast import ForecastOptions, TwinInputs
    from twin.workload import Workload

    cluster = Cluster((NodeSpec("a", "NVIDIA-A100-SXM4-80GB", 8), NodeSpec("b", "H200-SXM", 8)))
    inputs = TwinInputs(cluster=cluster, workload=Workload.from_durations([0.0], [10.0], gpus=1))
    proposed = [c.target for c in candidates(inputs, ForecastOptions())]
    assert "nodes:NVIDIA-A100-SXM4-80GB" in proposed and "nodes:H200-SXM" not in proposed


def test_a_misspelled_gpu_in_a_workload_file_is_refused_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    jobs = write(
        tmp_path,
        "jobs.csv",
        "job_id,arrival_s,gpus,duration_s,gpu_model\nj1,0,4,7200,A100-SXM\nj2,5,2,60,A100-SMX\n",
    )
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    error = capsys.readouterr().err
    assert "line 3: column 'gpu_model': unknown GPU model 'A100-SMX'" in error, error
    assert "did you mean 'NVIDIA-A100-SXM4-80GB'" in error


def test_jobs_without_a_gpu_type_on_a_cluster_of_several_types_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a gpu_model the twin cannot place a job on a cluster of two types: every job was rejected
    for want of capacity, exit 0."""
    cluster = write(
        tmp_path, "c.yaml", "nodes:\n  - {gpu_model: A100-SXM, count: 1}\n  - {gpu_model: L40S, count: 1}\n"
    )
    jobs = write(tmp_path, "jobs.csv", JOBS)
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "3 of 3 jobs name no gpu_model" in error and "L40S, NVIDIA-A100-SXM4-80GB" in error, error
    named = write(tmp_path, "named.csv", "job_id,arrival_s,gpus,duration_s,gpu_model\nj1,0,4,60,L40S\n")
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(named), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["jobs_completed"]["mean"] == 1


def test_a_forecast_with_an_empty_store_says_which_store_it_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["forecast", "--horizon", "1h", "--runs", "1"]) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert "is up in the store" in error
    assert f"looked in the store {(tmp_path / 'data' / 'finetwin.db').resolve()}" in error, error


SKILL = "(how the stored forecasts did)"
STORE = "(the store's telemetry)"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # Each ran what the other mode does, with the option silently ignored.
        (
            ["forecast", "--since", "5h"],
            f"--since applies only with --skill {SKILL}: add --skill, or leave --since out",
        ),
        (
            ["forecast", "--skill", "--horizon", "5h"],
            f"--horizon applies only to a forecast, not with --skill {SKILL}: drop --skill to forecast, or "
            "leave --horizon out",
        ),
        (  # given, even at the value a forecast takes by default
            ["forecast", "--skill", "--runs", "32", "--policy", "fifo", "--store"],
            f"--runs, --policy and --store apply only to a forecast, not with --skill {SKILL}",
        ),
        (
            ["backtest", "--from-store", "--at", "6h", "--horizon", "1h", "--window", "0:1h"],
            "--window applies only to the benchmark backtest (--bench), not with --from-store: drop "
            "--from-store to backtest --bench, or leave --window out",
        ),
        (
            ["backtest", "--from-store", "--at", "6h", "--horizon", "1h", "--load", "0.7", "--cluster", "c"],
            "--cluster and --load apply only to the benchmark backtest (--bench), not with --from-store",
        ),
        (  # was "give --bench FILE, or --from-store --at T --horizon H": --from-store was what was missing
            ["backtest", "--at", "6h", "--horizon", "1h"],
            f"--at and --horizon apply only with --from-store {STORE}, not to the benchmark backtest "
            "(--bench): add --from-store, or leave --at and --horizon out",
        ),
        (
            ["backtest", "--bench", "bench.csv", "--arrivals", "model"],
            f"--arrivals applies only with --from-store {STORE}",
        ),
    ],
)
def test_an_option_of_the_other_mode_is_refused_not_ignored(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    assert main(argv) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert expected in error, error


def test_the_options_of_a_mode_are_still_taken(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["forecast", "--skill", "--since", "5h", "--json"]) == 0
    assert "figures" in json.loads(capsys.readouterr().out)


def test_the_mean_of_skewed_runs_is_explained_and_stays_within_the_runs() -> None:
    """forecast printed a makespan mean above its own p90: with one run far from the rest that is what a
    mean does (it stays inside the runs' min and max); the table says so instead of leaving it a puzzle."""
    from twin.ensemble import spread

    runs = [20_000.0] * 19 + [80_000.0]
    figure = spread(runs)
    assert figure["p90"] < figure["mean"] <= max(runs)  # above p90, never above the largest run
    assert min(runs) <= figure["mean"]
    assert figure["mean"] == pytest.approx(23_000.0)


def test_the_forecast_table_notes_a_mean_outside_its_band(capsys: pytest.CaptureFixture[str]) -> None:
    from finetwin.commands.twin_output import print_forecast
    from twin.ensemble import spread

    skewed, even = spread([20_000.0] * 19 + [80_000.0]), spread([3600.0, 3700.0, 3800.0])
    doc = {
        "runs": 20, "horizon_s": 86_400, "policy": "fifo", "admission": "off", "models": "v0001",
        "summary": {"makespan_s": skewed, "wait_mean_s": even}, "slos": [],
    }  # fmt: skip
    print_forecast(doc)
    text = capsys.readouterr().out
    assert "note: the mean of makespan lies outside its p10-p90" in " ".join(text.split())
    assert "wait mean" not in text.split("note:")[1]  # only the skewed figure is named
    assert "6.39 h" in text  # 23,000 s as hours


def test_a_bare_off_in_a_scenario_is_the_word_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """YAML 1.1 reads a bare `off` as false: `admission: off` was refused ("Input should be 'off', 'reject'
    or 'repair'"), a message about the very word the user wrote. `on` says nothing an admission is."""
    write(tmp_path, "cluster.yaml", CLUSTER)
    write(tmp_path, "jobs.csv", JOBS)
    results = []
    for admission in ("off", '"off"'):
        scenario = write(
            tmp_path, "s.yaml",
            f"runs: 2\ncluster: cluster.yaml\nworkload: jobs.csv\nadmission: {admission}\n"
            f"changes:\n  admission: {admission}\n  policy: backfill\n",
        )  # fmt: skip
        assert main(["whatif", str(scenario), "--json"]) == 0, capsys.readouterr().err
        results.append(json.loads(capsys.readouterr().out)["changes"])
    assert results[0] == results[1] and results[0]["admission"] == "off"
    scenario = write(tmp_path, "s.yaml", "runs: 2\ncluster: cluster.yaml\nworkload: jobs.csv\nadmission: on")
    assert main(["whatif", str(scenario)]) == 2
    assert "admission" in capsys.readouterr().err
