"""Predicting a CSV of configurations: the same rows, in the same order, with the predictions added.

The input's own cells are written back exactly as they were (not re-typed), so a prediction file can be
joined back to its input by position or by any column of it; except a cell a spreadsheet would run as a
formula (`=...`, `@...`), which is written as text with a leading `'` (`twin.csv_cells`).
"""

from __future__ import annotations

import csv
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.loader import BenchmarkFormatError, load_configs_file
from twin.csv_cells import neutralise, neutralise_row, neutralise_texts

PREDICTION_COLUMNS: tuple[str, ...] = (
    "outcome", "rule", "p_valid", "tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90",
    "note",
)  # fmt: skip


@dataclass(frozen=True)
class PredictSummary:
    rows: int
    outcomes: dict[str, int]
    flagged: int  # rows with a note (a model name never seen, ...)


@dataclass(frozen=True)
class ConfigsFile:
    path: Path
    table: pd.DataFrame  # load_configs output
    header: list[str]
    raw_rows: list[list[str]]  # each row's cells as written, in the table's order


def read_configs(path: Path) -> ConfigsFile:
    """Raises `BenchmarkFormatError` (naming the line and column) for input it cannot read."""
    table, header, raw_rows = load_configs_file(path)
    clashing = [c for c in PREDICTION_COLUMNS if c in header]
    if clashing:
        raise BenchmarkFormatError(
            path, 1, clashing[0], "is a column that predict adds; rename or remove it in the input"
        )
    return ConfigsFile(path, table, header, raw_rows)


def write_predictions(models: Any, configs: ConfigsFile, output_path: Path) -> PredictSummary:
    """The input rows as written plus the prediction columns, atomically (all rows or no file)."""
    table = configs.table
    predicted = models.predict_frame(table) if len(table) else pd.DataFrame(columns=PREDICTION_COLUMNS)
    if len(predicted) != len(table):
        raise RuntimeError(f"the model returned {len(predicted)} predictions for {len(table)} rows")
    temporary = output_path.with_name(f".{output_path.name}.{uuid.uuid4().hex}")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temporary.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(neutralise_row([*configs.header, *PREDICTION_COLUMNS]))
            added = _prediction_cells(predicted)
            for cells, extra in zip(configs.raw_rows, added, strict=True):
                writer.writerow([*neutralise_texts(cells), *extra])
        os.replace(temporary, output_path)
    finally:
        temporary.unlink(missing_ok=True)
    outcomes = {str(k): int(v) for k, v in predicted["outcome"].value_counts().items()}
    flagged = int(predicted["note"].fillna("").astype(str).str.len().gt(0).sum()) if len(predicted) else 0
    return PredictSummary(len(table), outcomes, flagged)


def predict_csv(models: Any, input_path: Path, output_path: Path) -> PredictSummary:
    return write_predictions(models, read_configs(input_path), output_path)


def data_row_number(path: Path, line: int) -> int | None:
    """Which data row (1 = the first after the header) starts at a line of the file, for messages."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            next(reader, None)
            row = 0
            start = 2
            for fields in reader:
                if fields and not (len(fields) == 1 and not fields[0].strip()):
                    row += 1
                    if start <= line <= reader.line_num:
                        return row
                start = reader.line_num + 1
    except (OSError, csv.Error, UnicodeDecodeError):
        return None
    return None


def _prediction_cells(predicted: pd.DataFrame) -> list[tuple[str, ...]]:
    """The PREDICTION_COLUMNS of every row as text, formatted column by column."""
    if not len(predicted):
        return []
    columns = [
        [str(outcome) for outcome in predicted["outcome"]],
        [rule if isinstance(rule, str) else "" for rule in predicted["rule"]],
        _numbers(predicted["p_valid"], "{:.4f}"),
        _numbers(predicted["tokens_per_second_p10"], "{:.6g}"),
        _numbers(predicted["tokens_per_second_p50"], "{:.6g}"),
        _numbers(predicted["tokens_per_second_p90"], "{:.6g}"),
        # A note may quote the input (an unseen model's name): neutralised like the input's own cells.
        [neutralise(note) if isinstance(note, str) else "" for note in predicted["note"]],
    ]
    return list(zip(*columns, strict=True))


def _numbers(values: pd.Series, fmt: str) -> list[str]:
    numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
    finite = np.isfinite(numbers)
    return [
        fmt.format(number) if ok else "" for number, ok in zip(numbers.tolist(), finite.tolist(), strict=True)
    ]
