"""`finetwin predict` as an operator writes its input: the ten configuration columns are enough, every
missing column is named in one message, and a misspelled GPU stops with a suggestion (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from calibrate.loader import PREDICT_REQUIRED_COLUMNS, PROTOCOL_DEFAULTS
from finetwin.cli import main

ROW = {
    "method": "full", "model_name": "llama3-8b", "number_nodes": "1", "gpu_model": "NVIDIA-A100-SXM4-80GB",
    "number_gpus": "4", "tokens_per_sample": "2048", "batch_size": "16", "enable_roce": "0",
    "fast_moe": "0", "fast_kernels": "",
}  # fmt: skip


def write(path: Path, columns: list[str], rows: list[dict[str, str]]) -> Path:
    path.write_text("\n".join([",".join(columns), *(",".join(r[c] for c in columns) for r in rows)]) + "\n")
    return path


def predict(models: Path, configs: Path, output: Path) -> int:
    return main(["predict", "--models", str(models), "--input", str(configs), "--output", str(output)])


def test_the_ten_configuration_columns_are_enough(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert set(ROW) == set(PREDICT_REQUIRED_COLUMNS) and not set(ROW) & set(PROTOCOL_DEFAULTS)
    configs = write(tmp_path / "ten.csv", list(ROW), [ROW, ROW | {"number_gpus": "3"}])
    output = tmp_path / "pred.csv"
    assert predict(calibrated_models_dir, configs, output) == 0, capsys.readouterr().err
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert list(written.columns[: len(ROW)]) == list(ROW)  # the input as written, nothing added to it
    assert written.loc[0, "outcome"] in ("valid", "runtime") and float(written.loc[0, "p_valid"]) > 0
    assert written.loc[1, "outcome"] == "rejected"  # 16 is not divisible by 3 GPUs: the rule, exactly


def test_every_missing_column_is_named_at_once(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    columns = [c for c in ROW if c not in ("gpu_model", "batch_size", "fast_moe")]
    configs = write(tmp_path / "short.csv", columns, [ROW])
    assert predict(calibrated_models_dir, configs, tmp_path / "pred.csv") == 2
    error = capsys.readouterr().err
    assert "missing from the header: gpu_model, batch_size, fast_moe" in error, error


@pytest.mark.parametrize(("separator", "named"), [(";", "';'"), ("\t", "tabs")])
def test_a_file_separated_by_another_character_is_named_so(
    calibrated_models_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    separator: str,
    named: str,
) -> None:
    configs = tmp_path / "export.csv"
    configs.write_text(separator.join(ROW) + "\n" + separator.join(ROW.values()) + "\n")
    assert predict(calibrated_models_dir, configs, tmp_path / "pred.csv") == 2
    error = capsys.readouterr().err
    assert f"the header is one column with {named} in it: the file looks separated by {named}" in error, error
    assert "missing from the header" not in error  # not ten columns to look for: one fix


def test_a_misspelled_column_is_named_with_the_one_it_resembles(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    columns = [{"gpu_model": "gpu_modle"}.get(c, c) for c in ROW]
    configs = write(tmp_path / "typo.csv", columns, [{"gpu_modle": ROW["gpu_model"], **ROW}])
    assert predict(calibrated_models_dir, configs, tmp_path / "pred.csv") == 2
    error = capsys.readouterr().err
    assert "missing from the header: gpu_model (the header has 'gpu_modle': misspelled?)" in error, error
    # A column the header has as it should be is no misspelling of another (number_nodes for number_gpus).
    columns = [c for c in ROW if c != "number_gpus"]
    assert (
        predict(calibrated_models_dir, write(tmp_path / "short.csv", columns, [ROW]), tmp_path / "p.csv") == 2
    )
    error = capsys.readouterr().err
    assert "missing from the header: number_gpus (needed:" in error, error


def test_a_column_under_another_name_is_named_with_the_one_it_stands_for(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`seq_len` resembles `tokens_per_sample` in meaning, not in spelling: no hint was given."""
    columns = [{"tokens_per_sample": "seq_len"}.get(c, c) for c in ROW]
    configs = write(tmp_path / "seq.csv", columns, [{"seq_len": ROW["tokens_per_sample"], **ROW}])
    assert predict(calibrated_models_dir, configs, tmp_path / "pred.csv") == 2
    error = capsys.readouterr().err
    expected = "missing from the header: tokens_per_sample (the header has 'seq_len': another name for it?)"
    assert expected in error, error


def test_a_header_without_rows_is_said_so(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = write(tmp_path / "empty.csv", list(ROW), [])
    output = tmp_path / "pred.csv"
    assert predict(calibrated_models_dir, configs, output) == 0
    said = capsys.readouterr().out
    assert "no rows to predict" in said and "has a header and no data rows" in said, said
    assert output.read_text().splitlines()[0].startswith(",".join(ROW))


def test_predict_help_lists_the_columns_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for column in (*PREDICT_REQUIRED_COLUMNS, *PROTOCOL_DEFAULTS):
        assert column in text, column
    assert "bfloat16" in text


def test_a_misspelled_gpu_stops_predict_with_a_suggestion(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = write(tmp_path / "typo.csv", list(ROW), [ROW, ROW | {"gpu_model": "NVIDIA-A100-SXM4-80G"}])
    output = tmp_path / "pred.csv"
    assert predict(calibrated_models_dir, configs, output) == 2
    error = capsys.readouterr().err
    assert "line 3" in error and "unknown GPU model 'NVIDIA-A100-SXM4-80G'" in error, error
    assert "did you mean 'NVIDIA-A100-SXM4-80GB'" in error, error
    assert not output.exists()


def test_gpu_names_as_nvidia_tools_print_them_predict_as_the_benchmarks(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvidia-smi and DCGM print `NVIDIA A100-SXM4-80GB` (a space), people drop the vendor; both were
    refused as unknown GPUs (and a cluster reporting them was modelled as an unknown GPU)."""
    spellings = {
        "NVIDIA-A100-SXM4-80GB": ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", "nvidia_a100_sxm4_80gb"),
        "NVIDIA-A100-80GB-PCIe": ("NVIDIA A100 80GB PCIe",),
        "L40S": ("NVIDIA L40S",),
        "NVIDIA-H100-PCIe": ("NVIDIA H100 PCIe",),
    }
    rows = [ROW | {"gpu_model": name} for name in spellings]
    reported = [ROW | {"gpu_model": name} for names in spellings.values() for name in names]
    benchmark, printed = tmp_path / "benchmark.csv", tmp_path / "printed.csv"
    assert predict(calibrated_models_dir, write(tmp_path / "a.csv", list(ROW), rows), benchmark) == 0
    assert predict(calibrated_models_dir, write(tmp_path / "b.csv", list(ROW), reported), printed) == 0
    assert "warning" not in capsys.readouterr().err
    expected = pd.read_csv(benchmark, dtype=str, keep_default_na=False).drop(columns="gpu_model")
    repeats = [len(names) for names in spellings.values()]
    got = pd.read_csv(printed, dtype=str, keep_default_na=False)
    assert list(got["gpu_model"]) == [name for names in spellings.values() for name in names]  # as written
    pd.testing.assert_frame_equal(
        got.drop(columns="gpu_model"), expected.loc[expected.index.repeat(repeats)].reset_index(drop=True)
    )


def test_a_model_the_benchmark_never_measured_is_said_before_the_numbers(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = write(tmp_path / "typo.csv", list(ROW), [ROW | {"model_name": "lama3-8b"}] * 2 + [ROW])
    assert predict(calibrated_models_dir, configs, tmp_path / "pred.csv") == 0
    captured = capsys.readouterr()
    assert "warning (2 rows): 'lama3-8b' is not a model the benchmark measured" in captured.err, captured.err
    assert "did you mean 'llama3-8b'" in captured.err
    assert captured.err.count("warning") == 1  # the measured llama3-8b row: nothing to say


def test_yes_no_columns_take_words_as_a_spreadsheet_writes_them(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [ROW | {"enable_roce": word, "number_nodes": "2", "number_gpus": "16"} for word in ("TRUE", "yes")]
    rows += [ROW | {"enable_roce": word} for word in ("False", "off", "0")]
    output = tmp_path / "pred.csv"
    assert predict(calibrated_models_dir, write(tmp_path / "words.csv", list(ROW), rows), output) == 0
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert list(written["enable_roce"]) == ["TRUE", "yes", "False", "off", "0"]  # written back as they were
    as_numbers = [r | {"enable_roce": v} for r, v in zip(rows, ("1", "1", "0", "0", "0"), strict=True)]
    numbers = write(tmp_path / "numbers.csv", list(ROW), as_numbers)
    assert predict(calibrated_models_dir, numbers, tmp_path / "pred-numbers.csv") == 0
    same = pd.read_csv(tmp_path / "pred-numbers.csv", dtype=str, keep_default_na=False)
    assert list(same["tokens_per_second_p50"]) == list(written["tokens_per_second_p50"])  # read as 1/0
    capsys.readouterr()
    # Before it, yes/no written as the benchmark writes them (0.0, 1.0): the message named the first of
    # those (line 2, '0.0'), not the bad cell.
    before = [
        ROW | {"enable_roce": "0.0"},
        ROW | {"enable_roce": "1.0", "number_nodes": "2", "number_gpus": "16"},
    ]
    bad = write(tmp_path / "bad.csv", list(ROW), [*before, ROW | {"enable_roce": "maybe"}])
    assert predict(calibrated_models_dir, bad, tmp_path / "pred-bad.csv") == 2
    err = capsys.readouterr().err
    assert "line 4" in err and "enable_roce" in err and "'maybe' is not a yes/no value" in err, err


def test_a_large_file_is_predicted_a_part_at_a_time_as_it_is_whole(
    calibrated_models_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over CHUNK_BYTES, a file is read and predicted a part at a time (its memory bounded by the part): the
    same output, the unseen model counted over every part, and a bad cell in a late part named at its line
    and data row, with no output left behind."""
    from calibrate import predict as predict_module

    rows = [
        ROW | {"batch_size": str(b), "number_gpus": str(g)} for b in (8, 16, 32, 64) for g in (1, 2, 4, 8)
    ]
    rows = [*rows, ROW | {"model_name": "lama3-8b"}, *rows, ROW | {"model_name": "lama3-8b"}]
    configs = write(tmp_path / "configs.csv", list(ROW), rows)
    whole, parts = tmp_path / "whole.csv", tmp_path / "parts.csv"
    assert predict(calibrated_models_dir, configs, whole) == 0
    capsys.readouterr()
    monkeypatch.setattr(predict_module, "CHUNK_BYTES", 400)  # this file: 7 parts
    assert predict(calibrated_models_dir, configs, parts) == 0
    captured = capsys.readouterr()
    assert parts.read_bytes() == whole.read_bytes()
    assert "warning (2 rows): 'lama3-8b' is not a model the benchmark measured" in captured.err, captured.err
    assert f"{len(rows)} rows predicted" in captured.out

    bad = write(tmp_path / "bad.csv", list(ROW), [*rows, ROW | {"batch_size": "-3"}, *rows])
    output = tmp_path / "bad-pred.csv"
    assert predict(calibrated_models_dir, bad, output) == 2
    error = capsys.readouterr().err
    line = len(rows) + 2  # the header, then the rows before it
    assert f"line {line}: column 'batch_size'" in error and f"(data row {len(rows) + 1})" in error, error
    assert not output.exists() and not list(tmp_path.glob(".bad-pred.csv.*"))


@pytest.mark.parametrize(
    ("column", "value"),
    [
        # int() refuses 4,300 digits and more: a traceback ("Exceeds the limit ... for integer string
        # conversion") from the version's ordering number.
        ("fms_hf_tuning_version", "9" * 5000),
        ("experiment_id", "SFTTrainer.finetune-full-v1-gradient_accumulation_steps.1e400"),  # infinite
        ("identifier", "x-gradient_accumulation_steps." + "9" * 5000),
    ],
    ids=["version-digits", "steps-overflow", "steps-digits"],
)
def test_a_protocol_cell_past_any_real_value_is_predicted_as_an_unknown_one(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], column: str, value: str
) -> None:
    odd = ROW | {column: value}
    configs = write(tmp_path / "odd.csv", [*ROW, column], [odd])
    output = tmp_path / "pred.csv"
    assert predict(calibrated_models_dir, configs, output) == 0, capsys.readouterr().err
    written = pd.read_csv(output)
    assert written.loc[0, "outcome"] in ("valid", "runtime")
    assert 0 < written.loc[0, "tokens_per_second_p50"] < 1e9 and 0 <= written.loc[0, "p_valid"] <= 1
