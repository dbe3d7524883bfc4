"""`finetwin simulate` and `finetwin whatif` on explicit files: JSON shape, numbers, and bad input."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from finetwin.cli import main
from tests.conftest import SHARED_REFERENCE
from twin.workload import Workload, write_jobs_csv

CLUSTER = """nodes:
  - {gpu_model: A100-SXM, count: 1, gpus_per_node: 8}
"""


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(tmp_path / "no-models"))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_json_has_summary_spreads_and_run_zero_jobs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = write(tmp_path, "cluster.yaml", CLUSTER)
    jobs = write(
        tmp_path,
        "jobs.csv",
        "job_id,arrival_s,gpus,duration_s\nj1,0,4,100\nj2,10,8,50\nj3,20,2,30\n",
    )
    doc = run_json(capsys, ["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--runs", "3",
                            "--seed", "5", "--json"])  # fmt: skip
    assert set(doc["summary"]["wait_mean_s"]) == {"mean", "p10", "p90"}
    for figure in doc["summary"].values():
        assert set(figure) == {"mean", "p10", "p90"} or all(
            set(v) == {"mean", "p10", "p90"} for v in figure.values()
        )
    # The hand-computed case: FIFO waits 0, 90, 130 s.
    assert doc["summary"]["wait_mean_s"] == {"mean": 220 / 3, "p10": 220 / 3, "p90": 220 / 3}
    assert doc["jobs"] == [
        {"job_id": "j1", "wait_s": 0.0, "end_s": 100.0, "outcome": "completed"},
        {"job_id": "j2", "wait_s": 90.0, "end_s": 150.0, "outcome": "completed"},
        {"job_id": "j3", "wait_s": 130.0, "end_s": 180.0, "outcome": "completed"},
    ]
    backfill = run_json(capsys, ["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--policy",
                                 "backfill", "--json"])  # fmt: skip
    assert [j["end_s"] for j in backfill["jobs"]] == [100.0, 150.0, 50.0]


def test_simulate_round_trips_a_generated_workload(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(0)
    workload = Workload.from_durations(np.sort(rng.uniform(0, 1000, 50)), rng.exponential(60, 50), gpus=1)
    jobs = tmp_path / "jobs.csv"
    write_jobs_csv(workload, jobs)
    doc = run_json(capsys, ["simulate", "--cluster", str(write(tmp_path, "c.yaml", CLUSTER)), "--workload",
                            str(jobs), "--json"])  # fmt: skip
    assert len(doc["jobs"]) == 50 and all(j["outcome"] == "completed" for j in doc["jobs"])
    assert doc["summary"]["jobs_completed"]["mean"] == 50


def test_configured_jobs_without_a_calibrated_model_use_the_labelled_fallback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = write(
        tmp_path,
        "jobs.csv",
        "job_id,arrival_s,gpus,gpu_model,model_name,method,batch_size,tokens_per_sample,dataset_tokens,duration_s\n"
        "a,0,2,A100-SXM,llama3-8b,lora,8,1024,1e7,\n"
        "b,5,2,A100-SXM,llama3-8b,lora,7,1024,1e7,\n",
    )
    doc = run_json(capsys, ["simulate", "--cluster", str(write(tmp_path, "c.yaml", CLUSTER)), "--workload",
                            str(jobs), "--runs", "2", "--json"])  # fmt: skip
    assert doc["models"] == "fallback"
    assert [j["outcome"] for j in doc["jobs"]] == ["completed", "rejected"]  # batch 7 on 2 GPUs breaks a rule
    # A method as people write it, as a configurations CSV takes it: the same jobs.
    written = write(tmp_path, "written.csv", jobs.read_text().replace(",lora,", ",LoRA,"))
    again = run_json(capsys, ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--workload", str(written),
                              "--runs", "2", "--json"])  # fmt: skip
    assert again["jobs"] == doc["jobs"]


@pytest.mark.parametrize(
    ("csv_text", "expected"),
    [
        ("job_id,arrival_s\nj1,0\n", "column 'gpus': missing from the header"),
        (
            "job_id,arrival_s,gpu,duration_s\nj1,0,4,60\n",
            "column 'gpus': missing from the header (the header has 'gpu': misspelled?)",
        ),
        (
            "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\nj2,soon,1,10\n",
            "line 3: column 'arrival_s': not a number",
        ),
        ("job_id,arrival_s,gpus,duration_s\nj1,0,0,10\n", "line 2: column 'gpus': must be an integer"),
        # A whole number too large for any count was a traceback (OverflowError) (issue 10).
        ("job_id,arrival_s,gpus,duration_s\nj1,0,1e308,10\n", "line 2: column 'gpus': must be at most"),
        (
            "job_id,arrival_s,gpus,duration_s" + ",x" * 300 + "\nj1,0,1,10" + ",0" * 300 + "\n",
            "line 1: has 304 columns; at most 256 are read",
        ),
        ("job_id,arrival_s,gpus,duration_s\nj1,0,1,10\nj1,1,1,10\n", "line 3: column 'job_id': duplicate"),
        # Past any span the twin simulates: the series asked numpy for more memory than there is.
        (
            "job_id,arrival_s,gpus,duration_s\nj1,1e308,1,10\n",
            "column 'arrival_s': must be within 315,619,200 s",
        ),
        ("job_id,arrival_s,gpus,duration_s\nj1,0,1,-1e12\n", "column 'duration_s': must be within"),
        # A spreadsheet's export with ';' (or tabs): the separator named, not every column called missing.
        ("job_id;arrival_s;gpus\nj1;0;1\n", "line 1: the header is one column with ';' in it"),
        ("job_id\tarrival_s\tgpus\nj1\t0\t1\n", "the file looks separated by tabs"),
        (
            "job_id,arrival_s,gpus,duration_s,model_name,method,gpu_model,batch_size,tokens_per_sample,dataset_tokens\n"
            "j1,0,1,,llama3-8b,lora,L40S,8,,1e6\n",
            "line 2: column 'tokens_per_sample': empty",
        ),
        # Two counts of one job's GPUs: it held 8 and was simulated at the throughput of 4, without a word.
        (
            "job_id,arrival_s,gpus,number_gpus,gpu_model,model_name,method,batch_size,tokens_per_sample,dataset_tokens\n"
            "j1,0,4,4,A100-SXM,llama3-8b,lora,8,1024,1e7\nj2,0,8,4,A100-SXM,llama3-8b,lora,8,1024,1e7\n",
            "jobs.csv, line 3: column 'number_gpus': 4 disagrees with column 'gpus' (8): both are the job's "
            "GPU count; give the same number in both, or leave one column out",
        ),
        # Said as "row 0: column 'method' ..." by the models, of the distinct configurations, not the file.
        (
            "job_id,arrival_s,gpus,duration_s,model_name,method,gpu_model,batch_size,tokens_per_sample,dataset_tokens\n"
            "j1,0,1,,llama3-8b,lora,L40S,8,512,1e6\nj2,0,1,,llama3-8b,qlora,L40S,8,512,1e6\n",
            "line 3: column 'method': 'qlora' is not a method; one of full, lora, gptq-lora",
        ),
    ],
)
def test_bad_workload_names_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], csv_text: str, expected: str
) -> None:
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    jobs = write(tmp_path, "jobs.csv", csv_text)
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    err = capsys.readouterr().err
    assert "finetwin simulate: error:" in err and expected in err


def test_a_workload_may_give_its_gpu_count_as_number_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gpus` is the configuration's `number_gpus`: a file with the benchmark's name for the column (or both,
    equal) is the same workload, where it was refused as missing 'gpus'."""
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    config = "gpu_model,model_name,method,batch_size,tokens_per_sample,dataset_tokens"
    rows = [("a", 0, 2, "8"), ("b", 5, 4, "8"), ("c", 9, 2, "7")]  # c: batch 7 on 2 GPUs breaks a rule
    headers = {
        "gpus": ("gpus", lambda g: f"{g}"),
        "number_gpus": ("number_gpus", lambda g: f"{g}"),
        "both": ("gpus,number_gpus", lambda g: f"{g},{g}"),
    }
    runs = {}
    for name, (columns, counts) in headers.items():
        text = f"job_id,arrival_s,{columns},{config}\n" + "".join(
            f"{job},{arrival},{counts(gpus)},A100-SXM,llama3-8b,lora,{batch},1024,1e7\n"
            for job, arrival, gpus, batch in rows
        )
        jobs = write(tmp_path, f"{name}.csv", text)
        run = run_json(capsys, ["simulate", "--cluster", str(cluster), "--workload", str(jobs), "--runs", "2",
                                "--seed", "1", "--json"])  # fmt: skip
        del run["generated_at"], run["wall_s"]
        runs[name] = run
    assert runs["number_gpus"] == runs["gpus"] and runs["both"] == runs["gpus"]
    assert [j["outcome"] for j in runs["gpus"]["jobs"]] == ["completed", "completed", "rejected"]


def test_a_workload_row_without_number_nodes_spans_the_fewest_nodes_its_gpus_divide() -> None:
    """9 GPUs: 3 nodes of 3, as advise reads it. The default was ceil(9 / 8) = 2 nodes, which 9 GPUs do not
    divide: the job was rejected for a number of nodes it never gave."""
    from twin.workload import read_jobs_csv

    text = "job_id,arrival_s,gpus,gpu_model,model_name,method,batch_size,tokens_per_sample,dataset_tokens\n"
    rows = {"one": 4, "nine": 9, "sixteen": 16, "twelve": 12}
    text += "".join(f"{job},0,{n},A100-SXM,llama3-8b,lora,{n * 2},1024,1e7\n" for job, n in rows.items())
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "jobs.csv"
        path.write_text(text)
        workload = read_jobs_csv(path)
    nodes = [workload.catalog[int(k)].number_nodes for k in workload.config_idx]
    assert nodes == [1, 3, 2, 2]


def test_a_workload_row_keeps_its_protocol_for_the_models_and_writes_it_back(tmp_path: Path) -> None:
    """A jobs file derived from the benchmark keeps its descriptor columns (experiment id, identifier,
    tuning version, dtype), which the models' protocol features read; the reader left them out, so every
    row was predicted as of no known protocol."""
    from twin.workload import read_jobs_csv, write_jobs_csv

    text = (
        "job_id,arrival_s,gpus,gpu_model,model_name,method,batch_size,tokens_per_sample,dataset_tokens,"
        "experiment_id,identifier,fms_hf_tuning_version,torch_dtype\n"
        "capped,0,2,L40S,llama3-8b,lora,8,1024,1e7,SFTTrainer.finetune-lora-time-limit-v1.0.0,"
        "model_name.llama3-8b-number_gpus.2.0,2.4.0,bfloat16\n"
        "plain,0,2,L40S,llama3-8b,lora,8,1024,1e7,,,,\n"
    )
    path = write(tmp_path, "jobs.csv", text)
    workload = read_jobs_csv(path)
    capped, plain = (workload.catalog[int(k)] for k in workload.config_idx)
    assert capped.extra == {
        "experiment_id": "SFTTrainer.finetune-lora-time-limit-v1.0.0",
        "identifier": "model_name.llama3-8b-number_gpus.2.0",
        "fms_hf_tuning_version": "2.4.0",
        "torch_dtype": "bfloat16",
    }
    assert plain.extra == {} and len(workload.catalog) == 2  # the same configuration, another protocol
    write_jobs_csv(workload, tmp_path / "again.csv")
    again = read_jobs_csv(tmp_path / "again.csv")
    assert [c.extra for c in again.catalog] == [capped.extra, {}]


def test_a_workload_in_another_encoding_is_named_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the decoder's first block of 8 KB, where it reported the line it had read up to."""
    rows = [f"job{i},{i},1,10" for i in range(1, 1001)]
    rows[700] = "caf\u00e9," + rows[700].split(",", 1)[1]
    jobs = tmp_path / "jobs.csv"
    jobs.write_bytes(("job_id,arrival_s,gpus,duration_s\n" + "\n".join(rows) + "\n").encode("cp1252"))
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    err = capsys.readouterr().err
    assert "line 702: is not UTF-8 text (byte 0xe9 in 'caf\ufffd,701,1,10'): save the file as UTF-8" in err, (
        err
    )


def test_files_saved_with_a_byte_order_mark_read_as_without(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Excel's "CSV UTF-8" and Notepad's UTF-8 start a file with a byte-order mark: the workload's first
    column read as '\\ufeffjob_id' ("missing from the header") and a JSON configuration did not parse."""
    from advisor.config_file import read_config_file

    files = {
        "jobs.csv": "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\nj2,5,2,20\n",
        "c.yaml": CLUSTER,
        "job.json": '{"model_name": "llama3-8b", "method": "lora", "number_gpus": 2}',
    }
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    for directory, mark in ((plain, b""), (marked, b"\xef\xbb\xbf")):
        directory.mkdir()
        for name, text in files.items():
            (directory / name).write_bytes(mark + text.encode())
    runs = [
        run_json(capsys, ["simulate", "--cluster", str(d / "c.yaml"), "--workload", str(d / "jobs.csv"),
                          "--runs", "2", "--seed", "3", "--json"])
        for d in (plain, marked)
    ]  # fmt: skip
    for run in runs:  # when and how long: not what was read
        del run["generated_at"], run["wall_s"]
    assert runs[1] == runs[0], runs
    assert runs[0]["summary"]["jobs_completed"]["mean"] == 2, runs[0]["summary"]
    assert (
        read_config_file(marked / "job.json")
        == read_config_file(plain / "job.json")
        == json.loads(files["job.json"])
    )


def reading_yaml(tmp_path: Path, kind: str, path: Path) -> list[str]:
    """A command that reads `path` as its YAML file of `kind` (the other files it needs written beside it)."""
    jobs = write(tmp_path, "jobs.csv", "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\n")
    cluster = write(tmp_path, "cluster.yaml", CLUSTER)
    return {
        "cluster": ["simulate", "--cluster", str(path), "--workload", str(jobs)],
        "scenario": ["whatif", str(path)],
        "slo": ["plan", "--cluster", str(cluster), "--workload", str(jobs), "--slo", str(path), "--vary",
                "A100-SXM=1..2"],
        "advice": ["advise", str(path)],
    }[kind]  # fmt: skip


@pytest.mark.parametrize("kind", ["cluster", "scenario", "slo", "advice"])
def test_a_yaml_file_in_another_encoding_or_indented_with_tabs_is_named_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Both were tracebacks (UnicodeDecodeError) or the parser's four-line message."""
    legacy, tabbed = tmp_path / "legacy.yaml", tmp_path / "tabbed.yaml"
    legacy.write_bytes("# owner: Jos\u00e9\nname: x\n".encode("cp1252"))
    tabbed.write_text("name: x\nchanges:\n\tnodes: []\n")
    for path, said in (
        (legacy, "legacy.yaml, line 1: is not UTF-8 text (byte 0xe9 in '# owner: Jos\ufffd'): save the "
                 "file as UTF-8"),
        (tabbed, "tabbed.yaml: not valid YAML: line 3, column 1: found character '\\t' that cannot start any "
                 "token (YAML indents with spaces, not tabs)"),
    ):  # fmt: skip
        assert main(reading_yaml(tmp_path, kind, path)) == 2
        error = capsys.readouterr().err
        assert said in error and "Traceback" not in error, error


# Values PyYAML reads as a type they are not, each with what is said at its line and column (all were
# tracebacks: ValueError, KeyError or IndexError from its constructors).
UNREADABLE_VALUES = [
    ("when: 2026-13-45", "line 2, column 7: '2026-13-45' is not a valid timestamp (month must be in 1..12); "
                         "quote it to keep it as text"),
    ("when: [1, {at: 2026-02-30}]", "line 2, column 16: '2026-02-30' is not a valid timestamp (day is out of "
                                    "range for month)"),
    ("fast: !!bool maybe", "line 2, column 7: 'maybe' is not a valid bool (not written as one)"),
    ("gpus: !!int _", "line 2, column 7: '_' is not a valid int (not written as one)"),
    ("gpus: " + "9" * 5000, "line 2, column 7: '" + "9" * 40 + "'... (5,000 characters) is not a valid int "
                            "(exceeds the limit (4300 digits) for integer string conversion: value has 5000 "
                            "digits)"),
]  # fmt: skip


@pytest.mark.parametrize("kind", ["cluster", "scenario", "slo", "advice"])
@pytest.mark.parametrize(
    ("line", "said"), UNREADABLE_VALUES, ids=["date", "nested-date", "bool", "int", "digits"]
)
def test_a_yaml_value_that_is_not_the_type_it_looks_like_is_named_at_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, line: str, said: str
) -> None:
    path = write(tmp_path, "odd.yaml", f"name: x\n{line}\n")
    assert main(reading_yaml(tmp_path, kind, path)) == 2
    error = " ".join(capsys.readouterr().err.split())
    assert f"odd.yaml: not valid YAML: {said}" in error and "Traceback" not in error, error
    assert "set_int_max_str_digits" not in error


@pytest.mark.parametrize(
    ("options", "duration_s", "expected"),
    [
        (["--horizon", "99999999999h"], 10, "--horizon: at most 3,653 days (ten years)"),
        (["--interval", "1s", "--horizon", "3000d"], 10, "259,200,000 intervals; at most 100,000 (a longer"),
        # No --horizon: the series spans the jobs, known once they ran.
        (["--interval", "60s"], 3e8, "the series cannot be made: 300,000,000 s in intervals of 60 s is"),
        # Said "in intervals of 0 s".
        (["--interval", "0.5s", "--horizon", "24h"], 10, "86,400 s in intervals of 0.5 s is 172,800"),
        # Answered as if stepped by 48 h, its series one interval of 24 h (as whatif and plan refuse it).
        (["--interval", "48h", "--horizon", "24h"], 10, "interval '48h' is longer than the horizon '24h'"),
    ],
)
def test_a_series_that_cannot_be_made_is_refused_saying_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], duration_s: float, expected: str
) -> None:
    """Each was a traceback (numpy: 'Unable to allocate 745. GiB') or 'Maximum allowed size exceeded'."""
    jobs = write(tmp_path, "jobs.csv", f"job_id,arrival_s,gpus,duration_s\nj1,0,1,{duration_s}\n")
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs), *options]) == 2
    error = capsys.readouterr().err
    assert expected in error and "Traceback" not in error, error


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # A billion runs grew by 100 MB/s until memory ran out (and Ctrl-C did not stop it).
        (["--runs", "1000000000"], "--runs must be from 1 to 256, got 1,000,000,000"),
        (["--seed", "-1"], "--seed must be from 0 to 9,223,372,036,854,775,807, got -1"),  # was numpy's words
    ],
)
def test_runs_and_seeds_are_bounded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], expected: str
) -> None:
    jobs = write(tmp_path, "jobs.csv", "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\n")
    cluster = write(tmp_path, "c.yaml", CLUSTER)
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs), *options]) == 2
    assert expected in capsys.readouterr().err
    assert main(["backtest", "--bench", str(SHARED_REFERENCE / "real_sample.csv"), *options]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["simulate", "--cluster", "{cluster}", "--workload", "{jobs}"],
        ["forecast"],
        ["whatif", "{scenario}"],
        ["backtest", "--bench", str(SHARED_REFERENCE / "real_sample.csv")],
        ["plan", "--cluster", "{cluster}", "--workload", "{jobs}", "--vary", "A100-SXM=1..2"],
    ],
)
@pytest.mark.parametrize("workers", ["0", "-2"])
def test_workers_are_one_or_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str], workers: str
) -> None:
    """0 or a negative count of processes was taken as 1 without a word (exit 0)."""
    files = {
        "cluster": write(tmp_path, "c.yaml", CLUSTER),
        "jobs": write(tmp_path, "jobs.csv", "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\n"),
        "scenario": write(tmp_path, "s.yaml", "runs: 2\ncluster: c.yaml\nworkload: jobs.csv\n"),
    }
    argv = [part.format(**files) for part in command]
    assert main([*argv, "--workers", workers]) == 2
    expected = "--workers must be 1 or more (the processes to run on; leave it out to have them chosen for "
    assert f"{expected}the work), not {workers}" in " ".join(capsys.readouterr().err.split())


def test_an_invalid_setting_is_named_by_its_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command was a pydantic traceback."""
    monkeypatch.setenv("FINETWIN_FORECAST_RUNS", "100000")
    monkeypatch.setenv("FINETWIN_MAX_BODY_BYTES", "abc")
    assert main(["info"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("finetwin: error: invalid setting: "), error
    assert "FINETWIN_FORECAST_RUNS: Input should be less than or equal to 256 (got '100000')" in error
    assert "FINETWIN_MAX_BODY_BYTES: Input should be a valid integer" in error and "Traceback" not in error
    # A policy no scheduler has was a ValueError traceback once a forecast ran.
    monkeypatch.delenv("FINETWIN_FORECAST_RUNS")
    monkeypatch.delenv("FINETWIN_MAX_BODY_BYTES")
    monkeypatch.setenv("FINETWIN_FORECAST_POLICY", "bogus")
    jobs = write(tmp_path, "jobs.csv", "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\n")
    assert (
        main(["simulate", "--cluster", str(write(tmp_path, "c.yaml", CLUSTER)), "--workload", str(jobs)]) == 2
    )
    error = capsys.readouterr().err
    expected = (
        "FINETWIN_FORECAST_POLICY: Input should be 'fifo', 'backfill', 'spf' or 'conservative' (got 'bogus')"
    )
    assert expected in error, error


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("FINETWIN_STEERING_REPLICATIONS", "100000"),  # the ensemble of every steering what-if
        ("FINETWIN_REFIT_INTERVAL_MINUTES", "0"),  # a refit job every 0 minutes
        ("FINETWIN_INGEST_BATCH_SIZE", "0"),
        ("FINETWIN_API_PORT", "70000"),
        ("FINETWIN_FORECAST_LOOKBACK_DAYS", "-1"),
        ("FINETWIN_RELAY_POLL_SECONDS", "0"),
        ("FINETWIN_NATIVE_TREES", "of"),  # read where trees run, as "not off": a typo left them on
        ("FINETWIN_FORECAST_WORKERS", "0"),  # taken as 1 without a word, as --workers 0 was
    ],
)
def test_a_setting_out_of_its_range_stops_every_command_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["info"]) == 2
    error = capsys.readouterr().err
    assert f"invalid setting: {variable}: Input should be" in error and f"(got '{value}')" in error, error


NOT_A_TOPIC = "not a Kafka topic name: 1-249 ASCII letters, digits, '.', '_' or '-', and not '.' or '..'"


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        # Bounded as the telemetry's `cluster_id` is: the store's columns of it hold 200 characters.
        ("FINETWIN_CLUSTER_ID", "", "String should have at least 1 character"),
        ("FINETWIN_CLUSTER_ID", "c" * 201, "String should have at most 200 characters"),
        # A name Kafka refuses was a traceback from kafka-python when ingest subscribed.
        ("FINETWIN_TELEMETRY_TOPIC", "lab a telemetry", NOT_A_TOPIC),
        ("FINETWIN_DLQ_TOPIC", "..", NOT_A_TOPIC),
        ("FINETWIN_TELEMETRY_TOPIC", "t" * 250, NOT_A_TOPIC),
        ("FINETWIN_ACTIONS_TOPIC", "actions/lab-a", NOT_A_TOPIC),
        # The outbox's rows hold a topic's name in 200 characters.
        ("FINETWIN_ACTIONS_TOPIC", "a" * 201, "String should have at most 200 characters"),
        # A port that is not one was kafka-python's traceback (invalid literal for int()).
        ("FINETWIN_KAFKA_BOOTSTRAP", "kafka:no", "'kafka:no': the port must be a number from 1 to 65535"),
        ("FINETWIN_KAFKA_BOOTSTRAP", "k1:9092,,k2:9092", "'' names no host (HOST:PORT, comma-separated)"),
        (
            "FINETWIN_KAFKA_BOOTSTRAP",
            "fe80::1::2",
            "'fe80::1::2' is not HOST:PORT (an IPv6 host goes in brackets: [ADDRESS]:PORT)",
        ),
    ],
)
def test_a_name_the_store_or_kafka_cannot_take_stops_every_command_at_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["info"]) == 2
    assert f"invalid setting: {variable}: {said} (got {value!r})" in capsys.readouterr().err


@pytest.mark.parametrize(
    "bootstrap", ["kafka", "k1:9092, k2:9093", "10.0.0.7:29092", "[::1]:9092", "[::1]", "::1", "fe80::1"]
)
def test_every_bootstrap_list_kafka_python_reads_is_taken(bootstrap: str) -> None:
    from kafka.cluster import collect_hosts

    from ingest.settings import bootstrap_problem

    assert collect_hosts(bootstrap)  # kafka-python reads it
    assert bootstrap_problem(bootstrap) is None


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_bootstrap_setting_is_no_setting(monkeypatch: pytest.MonkeyPatch, empty: str) -> None:
    """As an empty FINETWIN_DATABASE_URL is: `up` then starts its own broker."""
    from ingest.settings import IngestSettings

    monkeypatch.setenv("FINETWIN_KAFKA_BOOTSTRAP", empty)
    assert IngestSettings().kafka_bootstrap is None
    assert main(["info"]) == 0


def test_a_bootstrap_option_that_is_not_one_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ingest", "--bootstrap", "kafka:0"]) == 2
    assert "--bootstrap: 'kafka:0': the port must be a number from 1 to 65535" in capsys.readouterr().err


def test_a_list_setting_that_is_not_json_is_named(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain path where a JSON list is read: it was pydantic-settings' SettingsError traceback."""
    monkeypatch.setenv("FINETWIN_REFIT_BENCHMARKS", "/data/a.csv")
    assert main(["info"]) == 2
    error = capsys.readouterr().err
    assert "invalid setting: FINETWIN_REFIT_BENCHMARKS: must be JSON" in error, error
    assert "Traceback" not in error


def test_a_database_url_that_is_not_one_is_named_without_its_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was SQLAlchemy's ArgumentError traceback from `info`; the URL is not repeated (it may hold a
    password)."""
    monkeypatch.setenv("FINETWIN_DATABASE_URL", "postgres ql://user:hunter2@db/finetwin")
    assert main(["info"]) == 2
    error = capsys.readouterr().err
    assert "invalid setting: FINETWIN_DATABASE_URL: not a database URL" in error, error
    assert "hunter2" not in error and "Traceback" not in error
    # A store finetwin does not run on was a traceback about a module ("No module named 'MySQLdb'").
    for url, driver in (
        ("mysql://root:hunter2@127.0.0.1/test", "mysql"),
        ("mariadb+pymysql://root:hunter2@db/finetwin", "mariadb+pymysql"),
        ("postgresql+psycopg2://user:hunter2@db/finetwin", "postgresql+psycopg2"),
        ("redis://:hunter2@127.0.0.1:6379", "redis"),
    ):
        monkeypatch.setenv("FINETWIN_DATABASE_URL", url)
        assert main(["keys", "list"]) == 2
        error = " ".join(capsys.readouterr().err.split())
        assert (
            "FINETWIN_DATABASE_URL: finetwin keeps its store in SQLite or PostgreSQL through psycopg 3"
            in error
        )
        assert error.endswith(f"not {driver}"), error
        assert "hunter2" not in error and "Traceback" not in error


def test_bad_cluster_says_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    jobs = write(tmp_path, "jobs.csv", "job_id,arrival_s,gpus,duration_s\nj1,0,1,10\n")
    cluster = write(tmp_path, "c.yaml", "nodes:\n  - {gpu_model: L40S, count: -2}\n")
    assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
    assert "nodes[0].count: must be a positive integer" in capsys.readouterr().err
    # A misspelled key is named with the key it resembles, at either level (was "unknown field(s) cnt", and a
    # misspelled `nodes` read as "expected a mapping with a 'nodes' list").
    for text, expected in (
        ("nodes:\n  - {gpu_model: L40S, cnt: 2}\n", "nodes[0]: unknown key 'cnt' (did you mean 'count'?)"),
        ("nodez:\n  - {gpu_model: L40S, count: 2}\n", "unknown key 'nodez' (did you mean 'nodes'?)"),
        # Counts past any cluster a file means built nodes until memory ran out; .inf was an OverflowError.
        ("nodes:\n  - {gpu_model: L40S, count: 99999999999999999999}\n",
         "nodes[0].count: 99,999,999,999,999,999,999 takes the cluster past 100,000 nodes"),
        ("nodes:\n  - {gpu_model: L40S, count: 60000}\n  - {gpu_model: H100, count: 40001}\n",
         "nodes[1].count: 40,001 takes the cluster past 100,000 nodes"),
        ("nodes:\n  - {gpu_model: L40S, gpus_per_node: 65}\n", "gpus_per_node: 65 is more GPUs than"),
        ("nodes:\n  - {gpu_model: L40S, count: .inf}\n", "count: must be a positive integer, got inf"),
        # A document nested past the parser's recursion was a RecursionError.
        ("nodes: " + "[" * 5000 + "]" * 5000 + "\n", "c.yaml: nested too deeply to read"),
    ):  # fmt: skip
        cluster = write(tmp_path, "c.yaml", text)
        assert main(["simulate", "--cluster", str(cluster), "--workload", str(jobs)]) == 2
        error = " ".join(capsys.readouterr().err.split())
        assert expected in error, error


def test_whatif_on_explicit_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(1)
    workload = Workload.from_durations(np.sort(rng.uniform(0, 3600, 300)), rng.exponential(200, 300), gpus=2)
    write_jobs_csv(workload, tmp_path / "jobs.csv")
    write(tmp_path, "cluster.yaml", CLUSTER)
    scenario = write(
        tmp_path,
        "scenario.yaml",
        "name: one more node\nhorizon: null\nruns: 2\ncluster: cluster.yaml\nworkload: jobs.csv\n"
        "changes:\n  nodes: [{gpu_model: A100-SXM, add: 1}]\n",
    )
    doc = run_json(capsys, ["whatif", str(scenario), "--json"])
    assert doc["name"] == "one more node"
    assert doc["difference"]["wait_mean_s"]["mean"] < 0
    assert doc["difference"]["jobs_completed"]["mean"] == 0

    bad = write(tmp_path, "bad.yaml", "changes:\n  optimizations: [warp_drive]\n")
    assert main(["whatif", str(bad)]) == 2
    assert "changes.optimizations.0" in capsys.readouterr().err


def test_a_whatif_adding_nodes_no_job_asks_for_says_they_would_stand_idle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Jobs name their GPU type: nodes of another type change nothing, and the what-if says why."""
    rng = np.random.default_rng(1)
    arrivals, durations = np.sort(rng.uniform(0, 3600, 200)), rng.exponential(300, 200)
    workload = Workload.from_durations(arrivals, durations, gpus=4, gpu_model="NVIDIA-A100-SXM4-80GB")
    write_jobs_csv(workload, tmp_path / "jobs.csv")
    write(tmp_path, "cluster.yaml", CLUSTER)
    common = "horizon: null\nruns: 2\ncluster: cluster.yaml\nworkload: jobs.csv\n"
    other = write(tmp_path, "l40s.yaml", common + "changes:\n  nodes: [{gpu_model: L40S, add: 2}]\n")
    doc = run_json(capsys, ["whatif", str(other), "--json"])
    assert doc["difference"]["wait_mean_s"]["mean"] == 0
    assert len(doc["notes"]) == 1 and "L40S" in doc["notes"][0] and "stand idle" in doc["notes"][0]
    assert main(["whatif", str(other)]) == 0
    assert "note: no known job asks for L40S" in " ".join(capsys.readouterr().out.split())
    same = write(tmp_path, "a100.yaml", common + "changes:\n  nodes: [{gpu_model: A100-SXM, add: 1}]\n")
    doc = run_json(capsys, ["whatif", str(same), "--json"])
    assert doc["notes"] == [] and doc["difference"]["wait_mean_s"]["mean"] < 0
    # A scenario of no change is the baseline: its zero difference is said to be by construction.
    nothing = write(tmp_path, "nothing.yaml", common + "changes: {}\n")
    doc = run_json(capsys, ["whatif", str(nothing), "--json"])
    assert doc["notes"] == ["the scenario changes nothing: it is the baseline, so every difference is zero"]
    assert doc["difference"]["wait_mean_s"]["mean"] == 0


@pytest.mark.parametrize(
    "word", ["0", "off", "OFF", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"]
)
def test_native_trees_read_a_word_as_the_settings_check_does(
    monkeypatch: pytest.MonkeyPatch, word: str
) -> None:
    from calibrate import native_trees
    from calibrate.settings import CalibrateSettings

    monkeypatch.setenv("FINETWIN_NATIVE_TREES", word)
    assert native_trees.enabled() is CalibrateSettings().native_trees


def test_a_cluster_scenario_or_slo_file_reads_numbers_with_an_exponent_as_numbers(tmp_path: Path) -> None:
    """YAML 1.1 reads `1e8` and `1.0e8` as text (it wants `1.0e+8`); every finetwin file reads them as
    YAML 1.2 and people do, while text stays text and a date stays a date."""
    from twin.text_files import read_yaml

    path = write(
        tmp_path, "f.yaml", "a: 1e8\nb: 1.0e8\nc: -2.5E-3\nd: 1.0e+8\ne: 1e8x\nf: 12\ng: 2025-01-01\n"
    )
    document = read_yaml(path)
    assert document["a"] == document["b"] == document["d"] == 1e8 and document["c"] == -2.5e-3
    assert document["e"] == "1e8x" and document["f"] == 12 and isinstance(document["f"], int)
    assert str(document["g"]) == "2025-01-01"
