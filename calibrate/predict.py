"""Predicting a CSV of configurations: the same rows, in the same order, with the predictions added.

The input's own cells are written back exactly as they were (not re-typed), so a prediction file can be
joined back to its input by position or by any column of it; except a cell a spreadsheet would run as a
formula (`=...`, `@...`), which is written as text with a leading `'` (`twin.csv_cells`).
"""

from __future__ import annotations

import csv
import math
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from calibrate.loader import BenchmarkFormatError, load_configs
from twin.csv_cells import neutralise_row

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
    raw_rows: dict[int, list[str]]  # each row as written, by its line in the file


def read_configs(path: Path) -> ConfigsFile:
    """Raises `BenchmarkFormatError` (naming the line and column) for input it cannot read."""
    table = load_configs(path)
    header, raw_rows = _raw_rows(path)
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
    lines = table["line"].to_numpy() if len(table) else []
    temporary = output_path.with_name(f".{output_path.name}.{uuid.uuid4().hex}")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temporary.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(neutralise_row([*configs.header, *PREDICTION_COLUMNS]))
            for line, row in zip(lines, predicted.itertuples(index=False), strict=True):
                writer.writerow(neutralise_row([*configs.raw_rows[int(line)], *_cells(row)]))
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


def _raw_rows(path: Path) -> tuple[list[str], dict[int, list[str]]]:
    """The header and every row as written, by the line the loader reports for it."""
    rows: dict[int, list[str]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader)]
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            rows[reader.line_num] = row
    return header, rows


def _cells(prediction: Any) -> list[str]:
    return [
        str(prediction.outcome),
        prediction.rule if isinstance(prediction.rule, str) else "",
        _number(prediction.p_valid, "{:.4f}"),
        _number(prediction.tokens_per_second_p10, "{:.6g}"),
        _number(prediction.tokens_per_second_p50, "{:.6g}"),
        _number(prediction.tokens_per_second_p90, "{:.6g}"),
        prediction.note if isinstance(prediction.note, str) else "",
    ]


def _number(value: Any, fmt: str) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return ""
    return fmt.format(number) if math.isfinite(number) else ""
