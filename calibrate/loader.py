"""Reads LLMFineTuningBench CSVs in their published schema and derives each row's outcome as the paper does.

The published file has quirks (integers written as floats, `fast_kernels` as a quoted Python list, mangled
tuning versions, empty measured columns on rows that did not run); this module absorbs them once, so
everything downstream sees clean, typed columns. A malformed file raises `BenchmarkFormatError` naming the
file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.columns import PREDICT_REQUIRED_COLUMNS, PROTOCOL_DEFAULTS
from twin.csv_cells import MAX_CSV_COLUMNS, may_start_formulas, too_many_columns
from twin.domain import (
    GPU_TYPES,
    METHODS,
    RULE_ORDER,
    Outcome,
    broken_rules,
    canonical_gpu_name,
    protocol_time_limit,
    unknown_gpu_message,
)  # fmt: skip
from twin.job_config import CONFIG_FIELDS, DESCRIPTOR_FIELDS, FIELD_MAXIMUMS
from twin.text_files import without_byte_order_mark

# Every column of the published file, in its order.
BENCHMARK_COLUMNS: tuple[str, ...] = (
    "identifier", "experiment_id", "method", "model_name", "number_nodes", "gpu_model", "number_gpus",
    "tokens_per_sample", "batch_size", "enable_roce", "fast_moe", "fast_kernels", "fms_hf_tuning_version",
    "gpu_memory_utilization_avg", "gpu_memory_utilization_min", "gpu_memory_utilization_peak",
    "gpu_memory_utilization_max", "gpu_compute_utilization_min", "cpu_memory_utilization",
    "gpu_compute_utilization_avg", "gpu_compute_utilization_max", "is_valid", "train_tokens_per_second",
    "cpu_compute_utilization", "train_samples_per_second", "model_load_time", "train_runtime",
    "lh_created_at", "train_steps_per_second", "gpu_power_watts_avg", "gpu_power_percent_max",
    "gpu_power_watts_min", "torch_dtype", "gpu_power_watts_max", "gpu_power_percent_avg",
    "dataset_tokens_per_second", "train_tokens_per_gpu_per_second", "dataset_tokens_per_second_per_gpu",
)  # fmt: skip

# What a configuration is: enough to predict a run, nothing measured. The columns of a configs CSV
# (`finetwin predict`): the one job configuration's fields (twin.domain.JobConfig) and the benchmark's
# descriptors, in the published file's order; its time cap comes from `experiment_id`, as in the benchmark.
CONFIG_COLUMNS: tuple[str, ...] = tuple(
    c for c in BENCHMARK_COLUMNS if c in CONFIG_FIELDS or c in DESCRIPTOR_FIELDS
)

POSITIVE_INT_COLUMNS = ("number_nodes", "number_gpus", "tokens_per_sample", "batch_size")
NON_NEGATIVE_INT_COLUMNS = ("fast_moe",)
FLAG_COLUMNS = ("enable_roce",)
# The largest value each whole-number column may hold: the one job configuration's bounds (what the store
# holds), far inside int64 (a `1e308` cast to int64 became garbage, and a traceback further on).
INT_MAXIMUMS = {c: int(FIELD_MAXIMUMS[c]) for c in POSITIVE_INT_COLUMNS + NON_NEGATIVE_INT_COLUMNS}
MEASURED_COLUMNS: tuple[str, ...] = tuple(
    c for c in BENCHMARK_COLUMNS if c not in CONFIG_COLUMNS and c not in ("is_valid", "lh_created_at")
)
# A valid run without these is not a run we can learn from.
REQUIRED_WHEN_VALID = ("dataset_tokens_per_second", "train_runtime")

_IDENTIFIER_SPLIT = re.compile(r"-(?=[a-z_]+\.)")

BUNDLED_BENCHMARK = "llmftbench_sample.csv"


class BenchmarkFormatError(ValueError):
    """A benchmark or configuration CSV that cannot be read; says where."""

    def __init__(self, path: str | Path, line: int | None, column: str | None, message: str) -> None:
        self.path = str(path)
        self.line = line
        self.column = column
        self.message = message
        where = self.path + (f", line {line}" if line is not None else "")
        what = f"column {column!r}: " if column else ""
        super().__init__(f"{where}: {what}{message}")


@dataclass(frozen=True, slots=True)
class Records:
    """Each data row's line as the file holds it: `text[starts[i]:ends[i]]`, UTF-8 without its line ending,
    which the csv module reads back as exactly that row's cells."""

    text: bytes
    starts: np.ndarray
    ends: np.ndarray
    # The cells that may start as a formula (twin.csv_cells.neutralise decides): where each one's text starts
    # and ends in `text` (up to the next comma), and its data row. A quoted cell, or a comma inside one, is
    # a false alarm at worst: its row is read again to tell.
    formula_starts: np.ndarray
    formula_ends: np.ndarray
    formula_rows: np.ndarray


@dataclass(frozen=True, slots=True)
class AsWritten:
    """A CSV's data rows as the file holds them, in the file's order: each row's line when every row is one
    plain line (the fast reader read it), else every cell as text."""

    header: list[str]  # stripped names
    records: Records | None
    cells: pd.DataFrame | None  # when records is None: every cell as text, under the header's names


@dataclass(frozen=True, slots=True)
class _Frame:
    path: str
    raw: pd.DataFrame  # the cells as written, as str: every column, or those `_read` was asked for
    lines: np.ndarray  # the file line of each row (header is line 1)
    header: list[str]  # every column's (stripped) name
    records: Records | None = None
    # Per column, its cells factorized (`factorize`, missing as a value), where the reader did so already.
    cells: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None


def bundled_benchmark_path() -> Path:
    """The real sample of LLMFineTuningBench shipped with finetwin (Apache-2.0, IBM Research)."""
    return Path(str(resources.files("calibrate") / "data" / BUNDLED_BENCHMARK))


def load_benchmark(path: str | Path) -> pd.DataFrame:
    """All 38 columns, typed, plus the derived columns `outcome`, `rule`, `fast_kernels` (bool),
    `time_limit_s` (NaN when uncapped) and `line` (the row's line in the file)."""
    frame = _read(path, BENCHMARK_COLUMNS)
    table = _typed_config(frame)
    is_valid = _numbers(frame, "is_valid")
    bad = ~np.isin(is_valid, (0.0, 1.0))
    _raise_first(frame, bad, "is_valid", "must be 0 or 1")
    table["is_valid"] = is_valid.astype(int)
    for column in MEASURED_COLUMNS:
        if column in ("fms_hf_tuning_version", "torch_dtype"):
            continue
        table[column] = _numbers(frame, column, allow_empty=True)
    table["lh_created_at"] = frame.raw["lh_created_at"].to_numpy()
    valid = table["is_valid"].to_numpy() == 1
    for column in REQUIRED_WHEN_VALID:
        values = table[column].to_numpy(dtype=float)
        _raise_first(
            frame,
            valid & np.isnan(values),
            column,
            "is no measured number: a valid run (is_valid 1) needs one",
        )
        # Positive, as telemetry's schema has it: one that was not was left out of the fit without a word.
        _raise_first(
            frame, valid & ~(np.isfinite(values) & (values > 0)), column,
            "on a valid run (is_valid 1) must be a positive, finite number",
        )  # fmt: skip
    rules = table["rule"].to_numpy()
    broke = pd.notna(rules)
    _raise_first(frame, valid & broke, "is_valid", "a valid run cannot break an admission rule")
    table["outcome"] = np.where(
        valid, Outcome.VALID.value, np.where(broke, Outcome.REJECTED.value, Outcome.RUNTIME.value)
    )
    return table


def load_configs(path: str | Path) -> pd.DataFrame:
    """Only the configuration columns are required (others are carried along untouched, as str)."""
    frame = _read(path, PREDICT_REQUIRED_COLUMNS)
    table = _configs_table(frame)
    for column in frame.raw.columns:
        if column not in table.columns:
            table[column] = frame.raw[column].to_numpy()
    return table


@dataclass(frozen=True, slots=True)
class DistinctConfigs:
    """A configurations CSV as a prediction reads it."""

    table: pd.DataFrame  # each distinct configuration once, typed (`load_configs`' columns), by first row
    rows: np.ndarray  # each data row's configuration: its index into `table`
    written: AsWritten  # the data rows as the file holds them


# The cells of a configurations CSV that a prediction reads: rows equal in all of them are one configuration.
_CONFIG_CELLS: tuple[str, ...] = (*PREDICT_REQUIRED_COLUMNS, *PROTOCOL_DEFAULTS)


def load_distinct_configs(path: str | Path, data: bytes | None = None) -> DistinctConfigs:
    """The configurations of a CSV, each distinct one typed once, and the file as read, from one pass over
    it. A CSV of 100,000 configurations resampled from the benchmark holds ~3,900 (typing every row cost
    ~0.3 s); a bad cell is named at the first row that holds it, as when every row is typed. `data`: the
    file's bytes (a part of it: its header and some of its rows), read from `path` when not given."""
    frame = _read(path, PREDICT_REQUIRED_COLUMNS, with_records=True, columns=_CONFIG_CELLS, data=data)
    present = [c for c in _CONFIG_CELLS if c in frame.raw.columns]
    cells = {c: factorize(frame.raw[c].to_numpy(dtype=object), missing_as_value=True) for c in present}
    rows = combined_codes(cells.values(), len(frame.raw))  # `distinct_rows_of`, keeping each column's codes
    first = first_rows(rows)
    distinct = frame.raw[present].iloc[first].reset_index(drop=True)
    # Each column's codes taken to the distinct rows are its factorizing there: every text's first row is a
    # distinct configuration's first, in the same order. The typing then factorizes no column again (~16
    # columns of up to 100,000 rows).
    first_cells = {c: (codes[first], texts) for c, (codes, texts) in cells.items()}
    table = _configs_table(_Frame(frame.path, distinct, frame.lines[first], frame.header, cells=first_cells))
    written = AsWritten(frame.header, frame.records, None if frame.records is not None else frame.raw)
    return DistinctConfigs(table, rows, written)


def _configs_table(frame: _Frame) -> pd.DataFrame:
    """The configuration columns typed, the protocol's taking their defaults where the file has none."""
    given = set(frame.raw.columns)
    with_defaults = frame.raw.assign(**{c: v for c, v in PROTOCOL_DEFAULTS.items() if c not in given})
    defaulted = _Frame(frame.path, with_defaults, frame.lines, frame.header, cells=frame.cells)
    table = _typed_config(defaulted, may_be_empty=set(PROTOCOL_DEFAULTS))
    # Once per distinct name (np.isin sorted 100,000 texts: ~15 ms).
    gpus = table["gpu_model"].to_numpy()
    unknown_gpu = each_distinct(gpus, lambda name: name not in GPU_TYPES).astype(bool)
    if unknown_gpu.any():  # taken as another GPU, every number would be about a GPU nobody has
        first = int(np.argmax(unknown_gpu))
        written = frame.raw["gpu_model"].iloc[first].strip()
        raise BenchmarkFormatError(
            frame.path, int(frame.lines[first]), "gpu_model", unknown_gpu_message(written)
        )
    return table


def _read(
    path: str | Path,
    required: Iterable[str],
    *,
    with_records: bool = False,
    columns: Iterable[str] | None = None,
    data: bytes | None = None,
) -> _Frame:
    """The file's cells and lines; with each row's line as written (`Records`) if asked, and if it is
    plain enough to have them. `columns`: the ones the caller reads (None: all); the fast reader holds only
    those, where they are in the file (the csv module's reader holds every column, to write rows again).
    `data`: the bytes to read as the file's (read from `path` when not given)."""
    path = Path(path)
    if data is None:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise BenchmarkFormatError(path, None, None, f"cannot open: {exc.strerror or exc}") from exc
    required = tuple(required)
    wanted = None if columns is None else tuple(columns)
    plain = _read_plain(path, data, required, with_records=with_records, columns=wanted)
    return plain or _read_with_csv_module(path, data, required)


def _read_with_csv_module(path: Path, data: bytes, required: tuple[str, ...]) -> _Frame:
    """Any CSV, row by row: what every error message (and its line) is defined by. From the bytes read, as
    the file was read before (a pipe cannot be read twice)."""
    from twin.text_files import SPREADSHEET_UTF8, not_utf8  # a decoder's error does not say the line

    data = without_byte_order_mark(data)
    problem = not_utf8(data)
    if problem is not None:
        raise BenchmarkFormatError(path, problem[0], None, problem[1] + SPREADSHEET_UTF8)
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        header = _header(path, reader, required)
        rows: list[list[str]] = []
        lines: list[int] = []
        try:
            for row in reader:
                line = reader.line_num
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise BenchmarkFormatError(
                        path, line, None, f"has {len(row)} fields, the header has {len(header)}"
                    )
                rows.append(row)
                lines.append(line)
        except csv.Error as exc:
            raise BenchmarkFormatError(path, reader.line_num, None, f"not valid CSV: {exc}") from None
    raw = pd.DataFrame(rows, columns=header, dtype=object)
    return _Frame(str(path), raw, np.asarray(lines, dtype=np.int64), header)


def _header(path: Path, reader: Any, required: tuple[str, ...]) -> list[str]:
    """The header row's names, stripped; raises for a header the file cannot be read with."""
    try:
        header = next(reader)
    except StopIteration:
        raise BenchmarkFormatError(path, 1, None, "empty file, expected a header row") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise BenchmarkFormatError(path, 1, None, f"not a CSV header: {exc}") from None
    if len(header) > MAX_CSV_COLUMNS:  # the benchmark has 38
        raise BenchmarkFormatError(path, 1, None, too_many_columns(len(header)))
    header = [h.strip() for h in header]
    missing = [column for column in required if column not in header]
    if missing:  # all of them at once: one fix, not one round per column
        from twin.csv_hints import resembling, separator_hint  # an error's path only

        named = ", ".join(c + resembling(c, header, required) for c in missing)
        raise BenchmarkFormatError(
            path,
            1,
            None,
            separator_hint(header) or f"missing from the header: {named} (needed: {', '.join(required)})",
        )
    duplicated = {h for h, n in Counter(header).items() if n > 1}
    if duplicated:
        raise BenchmarkFormatError(path, 1, sorted(duplicated)[0], "appears twice in the header")
    return header


# The fast reader. The csv module's reader cost ~1.2 s for 100,000 rows of 38 columns (and the typing after
# it ~0.4 s more: 3.8 million distinct str objects to hash), pandas' C parser ~0.3 s (one str object per
# distinct text of a column). It takes a file only when the two read the same cells for certain, and each
# row's line follows from the bytes: UTF-8 without NUL, every line one whole row (no line break or stray
# quote inside a cell, no lone \r), every non-blank line the header's number of fields. Anything else is
# read by the csv module, so that its errors, and their lines, stay what they were.
_LF, _CR, _QUOTE, _COMMA = b"\n"[0], b"\r"[0], b'"'[0], b","[0]


@dataclass(frozen=True, slots=True)
class _Lines:
    starts: np.ndarray  # the offset of each line's first byte
    ends: np.ndarray  # where each line's text ends (before its \r\n or \n)
    commas: np.ndarray  # the offset of every comma, inside quotes or not
    fields: np.ndarray  # each line's number of fields


def _read_plain(
    path: Path,
    data: bytes,
    required: tuple[str, ...],
    *,
    with_records: bool,
    columns: tuple[str, ...] | None = None,
) -> _Frame | None:
    """The file through pandas when every line is one plain row; None to read it with the csv module. The
    header is the csv module's (and its errors).

    pandas parses a large file in a thread while this one finds its lines: its tokenizer and numpy's scans
    release the GIL, so on 100,000 rows the two took ~0.3 s together, not ~0.45 s one after the other. It
    starts from the header line alone, before the lines show whether the file is plain enough."""
    data = without_byte_order_mark(data)
    if not (data.isascii() or _is_utf8(data)) or b"\x00" in data:
        return None
    first_line = data[: data.find(b"\n") + 1] if b"\n" in data else data
    try:
        header = _header(path, csv.reader(io.StringIO(first_line.decode("utf-8"), newline="")), required)
    except BenchmarkFormatError:
        if _lines(data) is None:  # the csv module reads this header otherwise, and says what is wrong
            return None
        raise
    wanted = range(len(header)) if columns is None else [i for i, h in enumerate(header) if h in columns]
    positions = None if columns is None else list(wanted)
    pool = ThreadPoolExecutor(max_workers=1) if len(data) >= _OVERLAP_FROM_BYTES else None
    cells = pool.submit(_read_cells, data, positions) if pool is not None else None
    try:
        lines = _lines(data)
        if lines is None:
            return None
        blank = lines.ends == lines.starts
        if len(header) < 2 or (lines.fields[1:][~blank[1:]] != len(header)).any():
            # One column: the csv path skips a line of any whitespace, pandas one of spaces and tabs only.
            return None
        rows = np.flatnonzero(~blank[1:]) + 1  # each data row's line, counted from 0
        names = [header[i] for i in wanted]
        raw = (cells.result() if cells is not None else _read_cells(data, positions)) if len(rows) else None
        if raw is None:
            raw = pd.DataFrame([], columns=names, dtype=object)
        raw.columns = names
    finally:
        if pool is not None:  # a file for the csv module: its pandas parse is not waited for
            pool.shutdown(wait=False, cancel_futures=True)
    records = None
    if with_records:
        formula_starts, formula_ends, formula_rows = _formula_cells(data, lines, rows)
        records = Records(
            data, lines.starts[rows], lines.ends[rows], formula_starts, formula_ends, formula_rows
        )
    return _Frame(str(path), raw, rows + 1, header, records)


# Below this size a file is parsed after its lines are found: a thread costs more than it saves.
_OVERLAP_FROM_BYTES = 1 << 20


def _read_cells(data: bytes, positions: list[int] | None) -> pd.DataFrame | None:
    """The data rows' cells as written (str, no NA) of the columns at `positions` (None: all), labelled by
    position; None without a data row. pandas skips blank lines, as the csv path does."""
    try:
        return pd.read_csv(
            io.BytesIO(data), engine="c", header=None, skiprows=1, dtype=object, na_filter=False,
            usecols=positions,
        )  # fmt: skip
    except pd.errors.EmptyDataError:
        return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _lines(data: bytes) -> _Lines | None:
    """Where each line of the file starts and ends, and its number of fields; None unless every line is
    whole rows: no lone \r (a line break to the csv module), no line longer than the csv module's largest
    field, quotes only around whole cells and never across a line break."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buffer == _LF)
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(buffer)]))
    if b"\r" in data:
        carriage = np.flatnonzero(buffer == _CR)
        if carriage[-1] + 1 == len(buffer) or (buffer[carriage + 1] != _LF).any():
            return None
        ends[np.searchsorted(newlines, carriage + 1)] -= 1
    if (ends - starts).max() >= csv.field_size_limit():
        return None
    commas = np.flatnonzero(buffer == _COMMA)
    fields = np.diff(np.searchsorted(commas, starts), append=len(commas)) + 1  # no line ending is a comma
    if b'"' in data:
        quotes = np.flatnonzero(buffer == _QUOTE)
        if not _quoted_cells_only(buffer, quotes, newlines):
            return None
        opening, closing = quotes[0::2], quotes[1::2]
        quoted_commas = np.searchsorted(commas, closing) - np.searchsorted(commas, opening)
        line = np.searchsorted(newlines, opening)
        fields -= np.bincount(line, weights=quoted_commas, minlength=len(starts)).astype(fields.dtype)
    return _Lines(starts, ends, commas, fields)


def _quoted_cells_only(buffer: np.ndarray, quotes: np.ndarray, newlines: np.ndarray) -> bool:
    """Every quote opens a cell, closes it, or is one of a doubled pair inside it, and no quoted cell spans
    a line break: then the quotes alternate opening (even places) and closing (odd places) as the csv
    module reads them, a doubled "" being a close and a reopening."""
    if len(quotes) % 2 or (np.searchsorted(quotes, newlines) % 2).any():
        return False
    opening, closing = quotes[0::2], quotes[1::2]
    before = np.where(opening > 0, buffer[opening - 1], _LF)
    after = np.where(closing + 1 < len(buffer), buffer[np.minimum(closing + 1, len(buffer) - 1)], _LF)
    return bool(
        np.isin(before, (_COMMA, _LF, _QUOTE)).all() and np.isin(after, (_COMMA, _LF, _CR, _QUOTE)).all()
    )


def _formula_cells(data: bytes, lines: _Lines, rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """The cells of the data rows (their lines, `rows`) that may start as a formula: where each starts, where
    it ends (at the next comma or its line's end) and its data row. Cells start at a line's start or after a
    comma: one inside quotes gives a false alarm, which `neutralise` then clears."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    row_starts = lines.starts[rows]
    first = may_start_formulas(buffer, row_starts)
    commas = lines.commas[: np.searchsorted(lines.commas, len(buffer) - 1)]  # a last comma starts no text
    later = commas[may_start_formulas(buffer, commas + 1)]
    later_lines = np.searchsorted(lines.starts, later, side="right") - 1
    in_data = later_lines > 0  # not the header's (blank lines hold no comma)
    starts = np.concatenate((row_starts[first], later[in_data] + 1))
    line_of = np.concatenate((rows[first], later_lines[in_data]))
    # The first comma from each start on (the header has one: a plain file has two columns or more).
    following = lines.commas[np.minimum(np.searchsorted(lines.commas, starts), len(lines.commas) - 1)]
    line_ends = lines.ends[line_of]
    ends = np.where(following >= starts, np.minimum(following, line_ends), line_ends)
    return starts, ends, np.searchsorted(rows, line_of)


def _typed_config(frame: _Frame, may_be_empty: Collection[str] = ()) -> pd.DataFrame:
    raw = frame.raw
    table = pd.DataFrame(index=raw.index)
    time_limits = np.full(len(raw), np.nan)
    for column in ("identifier", "experiment_id", "model_name", "gpu_model"):
        known = frame.cells.get(column) if frame.cells else None
        codes, distinct = known if known is not None else distinct_values(raw[column].to_numpy(dtype=object))
        stripped = np.array([text.strip() for text in distinct], dtype=object)
        if column not in may_be_empty:
            _raise_first(frame, (stripped == "")[codes], column, "is empty")
        table[column] = stripped[codes]
        if column == "experiment_id":  # its time cap from the same distinct texts (long ones: ~18 ms to find)
            time_limits = np.array([time_limit_seconds(text) for text in stripped], dtype=float)[codes]
    table["gpu_model"] = _each_distinct(table["gpu_model"], canonical_gpu_name).to_numpy()
    method = _each_cell(frame, "method", lambda text: text.strip().lower())
    _raise_first(frame, ~method.isin(METHODS).to_numpy(), "method", f"must be one of {', '.join(METHODS)}")
    table["method"] = method.to_numpy()
    for column in POSITIVE_INT_COLUMNS + NON_NEGATIVE_INT_COLUMNS + FLAG_COLUMNS:
        values = _flag_numbers(frame, column) if column in FLAG_COLUMNS else _numbers(frame, column)
        not_int = values != np.round(values)
        _raise_first(frame, not_int, column, "must be a whole number")
        if column in INT_MAXIMUMS:
            limit = INT_MAXIMUMS[column]
            _raise_first(frame, values > limit, column, f"must be at most {limit:,}")
        if column in POSITIVE_INT_COLUMNS:
            _raise_first(frame, values < 1, column, "must be at least 1")
        elif column in FLAG_COLUMNS:
            _raise_first(frame, ~np.isin(values, (0.0, 1.0)), column, "must be 0 or 1")
        else:
            _raise_first(frame, values < 0, column, "must not be negative")
        table[column] = values.astype(np.int64)
    table["enable_roce"] = table["enable_roce"].astype(bool)
    table["fast_kernels"] = _fast_kernels(frame)
    table["fms_hf_tuning_version"] = _each_cell(frame, "fms_hf_tuning_version", str.strip).to_numpy()
    dtype = _each_cell(frame, "torch_dtype", lambda text: text.strip() or "bfloat16")
    table["torch_dtype"] = dtype.to_numpy()
    table["time_limit_s"] = time_limits
    table["rule"] = broken_rules(
        *(table[c].to_numpy() for c in ("number_gpus", "batch_size", "fast_moe", "number_nodes"))
    )
    table["line"] = frame.lines
    return table


def each_distinct(values: np.ndarray, function: Callable[[Any], Any]) -> np.ndarray:
    """`function` of every value (an object array), computed once per distinct value: a CSV of 100,000
    configurations has a few hundred distinct texts per column, and string work per cell cost seconds."""
    codes, distinct = factorize(np.asarray(values, dtype=object), missing_as_value=True)
    return _each_code(codes, distinct, function)


def _each_code(codes: np.ndarray, distinct: Any, function: Callable[[Any], Any]) -> np.ndarray:
    """`function` of each distinct value, taken to the rows by their codes."""
    mapped = np.empty(len(distinct), dtype=object)
    mapped[:] = [function(value) for value in distinct]
    return mapped[codes]


def distinct_values(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct) of a column of texts, with values == distinct[codes]: work done per value on
    `distinct`, then taken by `codes`, is done once per distinct value (100,000 configurations hold a few
    thousand names, GPUs and protocols). Under DISTINCT_FROM_ROWS rows each row stands for itself: finding
    the repeats of an advice answer's ~70 rows costs more than it saves."""
    values = np.asarray(values, dtype=object)
    if len(values) < DISTINCT_FROM_ROWS:
        return np.arange(len(values)), values
    codes, distinct = factorize(values)
    distinct = np.asarray(distinct, dtype=object)
    missing = codes < 0
    if missing.any():  # factorize takes None and NaN for one value: each missing cell stands for itself
        codes[missing] = len(distinct) + np.arange(int(missing.sum()))
        distinct = np.concatenate([distinct, values[missing]])
    return codes, distinct


# From this many rows on, per-value work goes through the distinct values (`distinct_values`).
DISTINCT_FROM_ROWS = 1_000


try:  # pandas' own, not public: a pandas without it factorizes as pd.factorize does (slower, the same codes)
    from pandas._libs.hashtable import PyObjectHashTable as _PyObjectHashTable
except ImportError:  # pragma: no cover - the pinned pandas has it
    _PyObjectHashTable = None


def factorize(values: Any, *, missing_as_value: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """`pd.factorize(values, use_na_sentinel=not missing_as_value)`: the same codes and distinct values.

    For an object array through pandas' hash table of Python objects, which pd.factorize keeps for arrays
    that are not all str: for all-str ones it hashes every cell's text byte by byte, where a str caches its
    hash and a repeated object compares by identity (the columns read here repeat one object per distinct
    text). On 100,000 rows ~5 ms against ~25 ms a column of identifiers; `finetwin predict` of 100,000
    distinct configurations, which factorizes their columns ~70 times, took 2.5 s instead of 2.9 s. An array
    with a missing value, kept as a value, is left to pd.factorize, which takes None and NaN for one."""
    values = np.asarray(values)
    if values.dtype != object or _PyObjectHashTable is None:
        return pd.factorize(values, use_na_sentinel=not missing_as_value)
    table = _PyObjectHashTable(len(values))
    distinct, codes = table.factorize(
        values, na_sentinel=-1, na_value=None, mask=None, ignore_na=not missing_as_value
    )
    if missing_as_value and pd.isna(distinct).any():
        return pd.factorize(values, use_na_sentinel=False)
    return codes.astype(np.intp, copy=False), distinct


def distinct_rows_of(columns: Iterable[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `n` equal in every column (arrays of n values; a missing value equals a missing value): the
    position of each distinct row's first, in row order, and each row's index into them."""
    key = combined_codes((factorize(values, missing_as_value=True) for values in columns), n)
    return first_rows(key), key


def combined_codes(columns: Iterable[tuple[np.ndarray, Any]], n: int) -> np.ndarray:
    """One code per row of `n` for its codes in all `columns` (each factorized: its codes, its distinct
    values), numbered in order of first appearance.

    One integer key, column by column: ~2 ms a column on 100,000 rows, where np.unique over rows of codes
    sorted for 350 ms. The key is factorized again only when the next column could take it past int64,
    not after every column (each factorize of the key cost ~3 ms: ~40 ms of a 100,000-row prediction's
    ~40 columns of keys)."""
    key = np.zeros(n, dtype=np.int64)
    size = 1  # the key's values are below this
    for codes, distinct in columns:
        width = max(len(distinct), 1)
        if size * width > _KEY_LIMIT:
            key, found = pd.factorize(key)
            size = max(len(found), 1)
        key = key * width + codes
        size *= width
    key, _ = pd.factorize(key)
    return key.astype(np.intp, copy=False)


_KEY_LIMIT = 1 << 62


def first_rows(key: np.ndarray) -> np.ndarray:
    """Where each code of `key` (numbered in order of first appearance, as `combined_codes`') first occurs:
    where it exceeds every code before it (np.unique's sort cost ~8 ms on 100,000 rows)."""
    if not len(key):
        return np.zeros(0, dtype=np.intp)
    new = np.empty(len(key), dtype=bool)
    new[0] = True
    new[1:] = key[1:] > np.maximum.accumulate(key)[:-1]
    return np.flatnonzero(new)


def _each_distinct(values: pd.Series, function: Callable[[Any], Any]) -> pd.Series:
    return pd.Series(each_distinct(values.to_numpy(dtype=object), function), index=values.index, dtype=object)


def _cells(frame: _Frame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """The column's cells factorized (codes, distinct texts): the reader's, where it factorized them."""
    known = frame.cells.get(column) if frame.cells else None
    if known is not None:
        return known
    return factorize(frame.raw[column].to_numpy(dtype=object), missing_as_value=True)


def _each_cell(frame: _Frame, column: str, function: Callable[[Any], Any]) -> pd.Series:
    """`_each_distinct` of a column of the frame's cells, from `_cells`."""
    return pd.Series(_each_code(*_cells(frame, column), function), index=frame.raw.index, dtype=object)


def _numbers(frame: _Frame, column: str, *, allow_empty: bool = False) -> np.ndarray:
    """The column's numbers, each distinct text parsed once: over every cell this cost ~0.25 s of
    `finetwin predict` on 100,000 rows (six columns of a few hundred distinct texts)."""
    codes, distinct = _cells(frame, column)
    text = pd.Series([value.strip() for value in distinct], dtype=object)
    empty_text = (text == "").to_numpy()
    parsed = pd.to_numeric(text.where(~empty_text, None), errors="coerce").to_numpy(dtype=float)
    not_number = np.isnan(parsed) & ~empty_text & (text.str.lower() != "nan").to_numpy()
    empty, values, unparsable = empty_text[codes], parsed[codes], not_number[codes]
    if not allow_empty:
        _raise_first(frame, empty, column, "is empty, expected a number")
    if unparsable.any():
        first = int(np.argmax(unparsable))
        raise BenchmarkFormatError(
            frame.path, int(frame.lines[first]), column, f"{frame.raw[column].iloc[first]!r} is not a number"
        )
    infinite = np.isinf(values)
    _raise_first(frame, infinite, column, "must be finite")
    return values


# A yes/no column may be written as a number (the benchmark: 0.0, 1.0) or as a word (a spreadsheet: TRUE).
_FLAG_WORDS = {"true": "1", "yes": "1", "on": "1", "false": "0", "no": "0", "off": "0"}


def _flag_numbers(frame: _Frame, column: str) -> np.ndarray:
    """A yes/no column as 0/1 numbers: numbers as written, and true/false, yes/no, on/off in any case."""
    words = _each_cell(frame, column, lambda text: _FLAG_WORDS.get(text.strip().lower()))
    original = frame.raw[column]
    frame.raw[column] = words.fillna(original)
    try:  # the column's cells as changed here, not as the reader factorized them
        return _numbers(dataclasses.replace(frame, cells=None), column)
    except BenchmarkFormatError as exc:
        if "is not a number" not in str(exc):
            raise
        # The cell `_numbers` could not read, by its line: a test of the words alone took the benchmark's own
        # `0.0` for the bad cell, and named the first row of every file.
        first = int(np.flatnonzero(frame.lines == exc.line)[0])
        raise BenchmarkFormatError(
            frame.path, int(frame.lines[first]), column,
            f"{original.iloc[first]!r} is not a yes/no value (0/1, true/false, yes/no, on/off)",
        ) from None  # fmt: skip
    finally:
        frame.raw[column] = original


def _fast_kernels(frame: _Frame) -> np.ndarray:
    state = _each_cell(frame, "fast_kernels", _kernels_state).to_numpy()
    _raise_first(
        frame,
        pd.isna(state),
        "fast_kernels",
        "expected empty or a list such as ['True', 'True', 'True']",
    )
    return state.astype(bool)


def _kernels_state(text: str) -> bool | None:
    """True or False for a `fast_kernels` cell, None when it is neither."""
    lowered = text.strip().lower()
    if "true" in lowered or lowered in ("1", "1.0", "yes", "on"):
        return True
    if lowered in ("", "0", "0.0", "false", "no", "off", "none", "nan") or lowered.startswith("["):
        return False
    return None


def _raise_first(frame: _Frame, bad: np.ndarray, column: str, message: str) -> None:
    if bad.any():
        first = int(np.argmax(bad))
        value = frame.raw[column].iloc[first] if column in frame.raw.columns else ""
        raise BenchmarkFormatError(frame.path, int(frame.lines[first]), column, f"{value!r} {message}")


def time_limit_seconds(experiment_id: str) -> float:
    """The cap of a protocol (`twin.domain.protocol_time_limit`), NaN when it runs without a time limit."""
    limit = protocol_time_limit(experiment_id)
    return math.nan if limit is None else limit


def identifier_settings(identifier: str) -> dict[str, str]:
    """The `key.value` pairs of an identifier, including settings that have no column of their own."""
    settings: dict[str, str] = {}
    for part in _IDENTIFIER_SPLIT.split(identifier):
        key, _, value = part.partition(".")
        if key:
            settings[key] = value
    return settings


def outcome_counts(table: pd.DataFrame) -> dict[str, int]:
    counts = table["outcome"].value_counts()
    return {o.value: int(counts.get(o.value, 0)) for o in Outcome}


def rule_counts(table: pd.DataFrame) -> dict[str, int]:
    counts = table["rule"].where(table["outcome"] == Outcome.REJECTED.value).value_counts()
    return {r.value: int(counts.get(r.value, 0)) for r in RULE_ORDER}
