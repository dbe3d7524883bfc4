"""The benchmark loader: the paper's outcome derivation on real rows, and errors that say where."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from calibrate.loader import (
    BENCHMARK_COLUMNS,
    BenchmarkFormatError,
    bundled_benchmark_path,
    identifier_settings,
    load_benchmark,
    load_configs,
    outcome_counts,
    rule_counts,
    time_limit_seconds,
)
from tests.conftest import SHARED_REFERENCE


def test_bundled_sample_is_the_shared_reference_verbatim(sample_csv: Path) -> None:
    reference = SHARED_REFERENCE / "real_sample.csv"
    if not reference.exists():
        pytest.skip("shared/reference is not beside this checkout")
    assert sample_csv.read_bytes() == reference.read_bytes()
    assert (sample_csv.parent / "NOTICE.md").read_text().count("Apache") >= 1


def test_outcomes_of_the_real_sample_match_the_paper_definition(sample_csv: Path) -> None:
    table = load_benchmark(sample_csv)
    assert len(table) == 3983
    assert outcome_counts(table) == {"valid": 1406, "rejected": 1299, "runtime": 1278}


def test_rules_are_checked_in_the_papers_order(sample_csv: Path) -> None:
    table = load_benchmark(sample_csv)
    # Recompute independently with pandas on the raw file.
    raw = pd.read_csv(sample_csv)
    batch_rule = raw.batch_size % raw.number_gpus != 0
    ep = raw.fast_moe.where(raw.fast_moe > 0)
    ep_rule = ~batch_rule & ep.notna() & (raw.number_gpus % ep.fillna(1) != 0)
    invalid = raw.is_valid == 0
    assert rule_counts(table) == {
        "batch_size_not_multiple_of_gpus": int((invalid & batch_rule).sum()),
        "gpus_not_multiple_of_expert_parallel_degree": int((invalid & ep_rule).sum()),
        "gpus_not_multiple_of_nodes": 0,
    }
    rejected = table[table.outcome == "rejected"]
    assert rejected.rule.notna().all()
    assert table.loc[table.outcome != "rejected", "rule"].isna().all()


def test_quirks_are_absorbed(sample_csv: Path) -> None:
    table = load_benchmark(sample_csv)
    assert table.number_gpus.dtype.kind == "i" and table.batch_size.dtype.kind == "i"
    assert table.fast_kernels.dtype == bool and table.fast_kernels.sum() == 1378
    assert set(table.time_limit_s.dropna()) == {600.0}
    assert table.loc[table.is_valid == 0, "dataset_tokens_per_second"].isna().all()
    assert "0.0.1.2.0" in set(table.fms_hf_tuning_version)  # mangled versions kept as written
    assert list(table.columns[: len(BENCHMARK_COLUMNS)]) != []  # every column kept
    assert set(BENCHMARK_COLUMNS) <= set(table.columns)


def test_identifier_and_protocol_parsing() -> None:
    ident = (
        "dataset_id.news-tokens-16384plus-entries-4096-model_name.llama3-8b-number_gpus.2.0-"
        "model_max_length.512.0-batch_size.8.0-gpu_model.L40S"
    )
    settings = identifier_settings(ident)
    assert settings["dataset_id"] == "news-tokens-16384plus-entries-4096"
    assert settings["model_name"] == "llama3-8b" and settings["gpu_model"] == "L40S"
    assert time_limit_seconds("SFTTrainer.x-stop_after_seconds.600.0-optim.adamw") == 600.0
    assert pd.isna(time_limit_seconds("SFTTrainer.finetune-full-fsdp-v1.6.0"))


def _write_sample_with(tmp_path: Path, sample_csv: Path, row: int, column: str, value: str) -> Path:
    with sample_csv.open(newline="") as f:
        rows = list(csv.reader(f))
    rows[row][rows[0].index(column)] = value
    out = tmp_path / "bad.csv"
    with out.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return out


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("number_gpus", "two", "is not a number"),
        ("batch_size", "2.5", "whole number"),
        ("method", "qlora", "must be one of"),
        ("is_valid", "3", "0 or 1"),
        ("fast_kernels", "maybe", "fast_kernels"),
        ("model_name", "", "is empty"),
        ("enable_roce", "2", "0 or 1"),
    ],
)
def test_malformed_cell_names_file_line_and_column(
    tmp_path: Path, sample_csv: Path, column: str, value: str, message: str
) -> None:
    bad = _write_sample_with(tmp_path, sample_csv, 57, column, value)
    with pytest.raises(BenchmarkFormatError) as caught:
        load_benchmark(bad)
    err = caught.value
    assert (err.path, err.line, err.column) == (str(bad), 58, column)
    assert message in str(err) and "line 58" in str(err) and str(bad) in str(err)


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        ("dataset_tokens_per_second", "", "is no measured number"),
        ("dataset_tokens_per_second", "nan", "is no measured number"),
        # Each was left out of the fit without a word (telemetry's schema refuses them).
        ("dataset_tokens_per_second", "-500", "must be a positive, finite number"),
        ("dataset_tokens_per_second", "inf", "must be finite"),
        ("train_runtime", "0", "must be a positive, finite number"),
    ],
)
def test_a_valid_row_without_a_measured_throughput_and_run_time_is_refused(
    tmp_path: Path, sample_csv: Path, column: str, value: str, said: str
) -> None:
    table = load_benchmark(sample_csv)
    line = int(table.loc[table.is_valid == 1, "line"].iloc[3])
    bad = _write_sample_with(tmp_path, sample_csv, line - 1, column, value)
    with pytest.raises(BenchmarkFormatError, match=f"line {line}.*{column}.*{said}"):
        load_benchmark(bad)


def test_missing_column_ragged_row_and_missing_file(tmp_path: Path, sample_csv: Path) -> None:
    lines = sample_csv.read_text().splitlines()
    header = lines[0].split(",")
    no_power = tmp_path / "no_column.csv"
    keep = [i for i, h in enumerate(header) if h != "gpu_power_watts_avg"]
    with no_power.open("w", newline="") as f:
        w = csv.writer(f)
        for row in csv.reader(lines[:3]):
            w.writerow([row[i] for i in keep])
    with pytest.raises(BenchmarkFormatError, match="line 1: missing from the header: gpu_power_watts_avg "):
        load_benchmark(no_power)

    ragged = tmp_path / "ragged.csv"
    ragged.write_text("\n".join([*lines[:5], "a,b,c", *lines[5:8]]) + "\n")
    with pytest.raises(BenchmarkFormatError, match="line 6: has 3 fields"):
        load_benchmark(ragged)

    with pytest.raises(BenchmarkFormatError, match="cannot open"):
        load_benchmark(tmp_path / "nope.csv")


def test_a_file_in_another_encoding_is_named_at_the_line_of_its_first_such_byte(
    tmp_path: Path, sample_csv: Path
) -> None:
    """A spreadsheet's export in Windows-1252: the line of the first byte that is not UTF-8, far past the
    decoder's first block (it reported the header, or the line it had read up to)."""
    lines = sample_csv.read_text().splitlines()[:300]
    lines[250] = "caf\u00e9-" + lines[250]
    legacy = tmp_path / "legacy.csv"
    legacy.write_bytes("\n".join(lines).encode("cp1252") + b"\n")
    for load in (load_benchmark, load_configs):
        with pytest.raises(BenchmarkFormatError, match=r"line 251: is not UTF-8 text \(byte 0xe9 in 'caf.-"):
            load(legacy)


def test_configs_need_only_configuration_columns(tmp_path: Path, sample_csv: Path) -> None:
    full = pd.read_csv(sample_csv, dtype=str, keep_default_na=False)
    configs = full[["identifier", "experiment_id", "method", "model_name", "number_nodes", "gpu_model",
                    "number_gpus", "tokens_per_sample", "batch_size", "enable_roce", "fast_moe",
                    "fast_kernels", "fms_hf_tuning_version", "torch_dtype"]].head(20)  # fmt: skip
    configs = configs.assign(note="kept")
    path = tmp_path / "configs.csv"
    configs.to_csv(path, index=False)
    table = load_configs(path)
    assert len(table) == 20 and (table.note == "kept").all()
    assert bundled_benchmark_path().exists()
