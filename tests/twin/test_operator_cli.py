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


def test_a_misspelled_gpu_in_a_whatif_is_refused_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "cluster.yaml", CLUSTER)
    write(tmp_path, "jobs.csv", JOBS)
    scenario = write(
        tmp_path, "s.yaml",
        "runs: 2\ncluster: cluster.yaml\nworkload: jobs.csv\nchanges:\n  nodes: [{gpu_model: L40, add: 1}]\n",
    )  # fmt: skip
    assert main(["whatif", str(scenario)]) == 2
    error = capsys.readouterr().err
    assert "changes.nodes.0.gpu_model" in error and "unknown GPU model 'L40'" in error, error
    assert "did you mean 'L40S'" in error


def test_an_unknown_key_in_a_whatif_is_named_with_the_key_it_resembles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = write(tmp_path, "s.yaml", "name: x\nrun: 2\n")
    assert main(["whatif", str(scenario)]) == 2
    assert "unknown key 'run' (did you mean 'runs'?)" in capsys.readouterr().err


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
    declare_slos(engine, declared, actor="test")
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
