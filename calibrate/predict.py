"""Predicting a CSV of configurations: the same rows, in the same order, with the predictions added.

The input's own cells are written back exactly as they were (not re-typed), so a prediction file can be
joined back to its input by position or by any column of it; except a cell a spreadsheet would run as a
formula (`=...`, `@...`), which is written as text with a leading `'` (`twin.csv_cells`).
"""

from __future__ import annotations

import bisect
import csv
import math
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd

from calibrate.loader import AsWritten, BenchmarkFormatError, Records, each_distinct, load_distinct_configs
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
    table: pd.DataFrame  # each distinct configuration once (`calibrate.loader.load_distinct_configs`)
    rows: np.ndarray  # each data row's configuration: its index into `table`
    header: list[str]
    written: AsWritten  # each data row as written, in the file's order


def read_configs(path: Path, data: bytes | None = None) -> ConfigsFile:
    """Raises `BenchmarkFormatError` (naming the line and column) for input it cannot read. `data`: the
    file's bytes (or its header and some of its rows), read from `path` when not given."""
    configs = load_distinct_configs(path, data)
    header = configs.written.header
    clashing = [c for c in PREDICTION_COLUMNS if c in header]
    if clashing:
        raise BenchmarkFormatError(
            path, 1, clashing[0], "is a column that predict adds; rename or remove it in the input"
        )
    return ConfigsFile(path, configs.table, configs.rows, header, configs.written)


# A file larger than this is read and predicted a part at a time, each about this large (whole rows): the
# memory a prediction takes is then bounded by the part, not the file (about twice the bytes held, and
# 0.35 KB a row; a million rows of the benchmark's 38 columns read whole took 1.7 GB).
CHUNK_BYTES = 64 << 20


def configs_in_chunks(path: Path, chunk_bytes: int | None = None) -> Iterator[ConfigsFile]:
    """The file's configurations: the whole file at once, or, for a file over `chunk_bytes` (CHUNK_BYTES),
    a part at a time (its header and whole rows), each read as the whole file would be. A bad cell raises
    `BenchmarkFormatError` with its line in the file, when its part is read.

    A part ends after a line break with an even number of quotes before it, which ends a row in any file
    whose quotes open and close cells. A part the fast reader takes is such a file, its lines whole rows,
    so the part after it starts a row. A part it does not take (a quoted line break, a stray quote), or that
    cannot be read, may have been cut inside a cell: it is read again with the rest of the file, as one
    part (a bad cell is then said as the whole file would say it)."""
    limit = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    try:
        large = path.is_file() and path.stat().st_size > limit
    except OSError:
        large = False  # read_configs says what is wrong with it
    if not large:
        yield read_configs(path)
        return
    lines_before = 0  # the file's lines before the part, after the header
    with path.open("rb") as handle:
        header = handle.readline(1 << 20)
        if not _plain_header(header):
            yield read_configs(path)
            return
        carry = b""
        while block := handle.read(limit):
            data = carry + block
            cut = _row_end(data)
            rows, carry = data[:cut], data[cut:]
            if not rows:
                continue
            try:
                part: ConfigsFile | None = _part(path, header + rows, lines_before)
            except BenchmarkFormatError:
                part = None  # said again below, if it is not the cut's doing
            if part is None or part.written.records is None:  # maybe cut inside a cell: with the rest, as one
                yield _part(path, header + rows + carry + handle.read(), lines_before)
                return
            yield part
            # Lines as the csv module counts them, as an error's line is: a lone \r ends one as well.
            lines_before += rows.count(b"\n") + rows.count(b"\r") - rows.count(b"\r\n")
        if carry:
            yield _part(path, header + carry, lines_before)


def _part(path: Path, data: bytes, lines_before: int) -> ConfigsFile:
    """`read_configs` of a part (its header and some rows): a bad cell's line is made its line in the file."""
    try:
        return read_configs(path, data)
    except BenchmarkFormatError as exc:
        line = exc.line + lines_before if exc.line is not None and exc.line > 1 else exc.line
        raise BenchmarkFormatError(path, line, exc.column, exc.message) from None


def _plain_header(header: bytes) -> bool:
    """Whether the file's first line (up to 1 MB of it) is the whole header: ended by \n, no other line
    break and no quoted cell open at its end. Else the file is read whole, as a file always was."""
    body = header.removesuffix(b"\n").removesuffix(b"\r")
    return header.endswith(b"\n") and b"\r" not in body and header.count(b'"') % 2 == 0


def _row_end(data: bytes) -> int:
    """Where the last row that ends in `data` ends (after its \n); 0 for none. `data` starts a row."""
    cut = data.rfind(b"\n") + 1
    quotes = data.count(b'"', 0, cut)
    while cut and quotes % 2:  # this \n is inside a quoted cell: try the one before
        before = data.rfind(b"\n", 0, cut - 1) + 1
        quotes -= data.count(b'"', before, cut)
        cut = before
    return cut


def write_predictions(
    models: Any,
    configs: ConfigsFile | Iterable[ConfigsFile],
    output_path: Path,
    each: Callable[[ConfigsFile], object] | None = None,
) -> PredictSummary:
    """The input rows as written plus the prediction columns, atomically (all rows or no file), from the
    whole file or its parts in order (`configs_in_chunks`). Each distinct configuration of a part is
    predicted and formatted once. `each(part)` hears every part before it is predicted."""
    parts = [configs] if isinstance(configs, ConfigsFile) else configs
    rows, flagged, outcomes = 0, 0, Counter[str]()
    temporary = output_path.with_name(f".{output_path.name}.{uuid.uuid4().hex}")
    output_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with temporary.open("wb") as handle:
            for number, part in enumerate(parts):
                if each is not None:
                    each(part)
                if number == 0:
                    header = _row_text(neutralise_row([*part.header, *PREDICTION_COLUMNS]))
                    handle.write(f"{header}{_LINE_END}".encode())
                summary = _write_part(models, part, handle)
                rows, flagged = rows + summary.rows, flagged + summary.flagged
                outcomes.update(summary.outcomes)
        os.replace(temporary, output_path)
    finally:
        temporary.unlink(missing_ok=True)
    return PredictSummary(rows, dict(outcomes), flagged)


def _write_part(models: Any, configs: ConfigsFile, handle: BinaryIO) -> PredictSummary:
    table = configs.table
    predicted = (
        models.predict_frame(table, distinct=True) if len(table) else pd.DataFrame(columns=PREDICTION_COLUMNS)
    )
    if len(predicted) != len(table):
        raise RuntimeError(f"the model returned {len(predicted)} predictions for {len(table)} rows")
    texts = _prediction_texts(predicted)
    _write_rows(handle, configs.written, [texts[i] for i in configs.rows.tolist()])
    repeats = np.bincount(configs.rows, minlength=len(table))  # how many rows hold each configuration
    outcomes = pd.Series(repeats).groupby(predicted["outcome"].astype(str).to_numpy()).sum()
    noted = predicted["note"].fillna("").astype(str).str.len().gt(0).to_numpy() if len(predicted) else []
    flagged = int(repeats[noted].sum())
    return PredictSummary(len(configs.rows), {str(k): int(v) for k, v in outcomes.items()}, flagged)


def predict_csv(models: Any, input_path: Path, output_path: Path) -> PredictSummary:
    return write_predictions(models, configs_in_chunks(input_path), output_path)


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


_LINE_END = "\r\n"  # the csv module's (excel dialect), which the file was written with before


class _Echo:
    """A file for csv.writer that hands each row's text back: `writerow` returns what `write` returns."""

    def write(self, text: str) -> str:
        return text


def _row_text(cells: list[Any]) -> str:
    """A row as the csv module writes it (quoting what needs it), without its line ending. Written with the
    ending, then cut: the csv module quotes a cell's \r or \n only when its line ending holds it."""
    return csv.writer(_Echo(), lineterminator=_LINE_END).writerow(cells)[: -len(_LINE_END)]


def _write_rows(handle: BinaryIO, written: AsWritten, predictions: list[bytes]) -> None:
    """Every data row's output line: its cells as written (formula-like ones neutralised), the predictions.
    Written WRITE_BLOCK_ROWS rows at a time: the whole output joined at once doubled the memory of a large
    file (a million rows: 2.2 GB)."""
    if written.records is None:
        assert written.cells is not None  # the csv module's reader holds every cell
        rows = written.cells.to_numpy().tolist()
        for first in range(0, len(rows), WRITE_BLOCK_ROWS):
            block = slice(first, first + WRITE_BLOCK_ROWS)
            handle.write(
                b"".join(
                    _row_text(neutralise_texts(cells)).encode() + added
                    for cells, added in zip(rows[block], predictions[block], strict=True)
                )
            )
        return
    _write_records_with(handle, written.records, predictions)


# Rows per write of `finetwin predict`'s output.
WRITE_BLOCK_ROWS = 20_000


def _write_records_with(handle: BinaryIO, records: Records, predictions: list[bytes]) -> None:
    """Each row's line as the file holds it (which reads back as its cells), the predictions appended; a row
    with a cell that starts as a formula is written from its cells, neutralised. For 100,000 rows of 38
    columns ~0.1 s, where csv.writer took ~1 s to write every cell again."""
    text = records.text
    starts, ends = records.starts.tolist(), records.ends.tolist()
    neutralised = dict(_neutralised_rows(records))
    marked = sorted(neutralised)
    for first in range(0, len(predictions), WRITE_BLOCK_ROWS):
        last = min(first + WRITE_BLOCK_ROWS, len(predictions))
        pieces: list[bytes] = [b""] * (2 * (last - first))
        pieces[0::2] = [
            text[start:end] for start, end in zip(starts[first:last], ends[first:last], strict=True)
        ]
        pieces[1::2] = predictions[first:last]
        for row in marked[bisect.bisect_left(marked, first) : bisect.bisect_left(marked, last)]:
            pieces[2 * (row - first)] = _row_text(neutralised[row]).encode()
        handle.write(b"".join(pieces))


def _neutralised_rows(records: Records) -> list[tuple[int, list[str]]]:
    """The rows with a cell `neutralise` changes, with their neutralised cells. Only the cells that may start
    as a formula are looked at, from the file's bytes, once per distinct text (a column of negative numbers,
    `model_load_time` -1.0 in the benchmark, marks most rows, and `neutralise` leaves a number alone); a row
    is read with the csv module only when one of them would change, or is quoted."""
    if not len(records.formula_rows):
        return []
    text = records.text
    candidates = np.empty(len(records.formula_starts), dtype=object)
    candidates[:] = [
        text[start:end]
        for start, end in zip(records.formula_starts.tolist(), records.formula_ends.tolist(), strict=True)
    ]
    suspect = each_distinct(candidates, _may_change).astype(bool)
    changed: list[tuple[int, list[str]]] = []
    for row in np.unique(records.formula_rows[suspect]).tolist():
        line = text[records.starts[row] : records.ends[row]].decode("utf-8")
        cells = next(csv.reader([line]))
        neutralised = [neutralise(cell) for cell in cells]
        if neutralised != cells:
            changed.append((row, neutralised))
    return changed


def _may_change(cell: bytes) -> bool:
    """Whether `neutralise` may change a cell, from its text up to the next comma: a quoted cell is read
    whole first (its quotes, and any comma in it, are not its text)."""
    if cell.startswith(b'"'):
        return True
    written = cell.decode("utf-8")
    return neutralise(written) != written


# The prediction cells after a row's own, for a row whose four numbers are finite: "%.4f" and "%.6g" are the
# "{:.4f}" and "{:.6g}" of `_number` (the same digits), and one formatting per row cost ~0.1 s less than one
# per cell and a join for 100,000 distinct configurations.
_PREDICTIONS_ROW = b",%s,%s,%.4f,%.6g,%.6g,%.6g,%s" + _LINE_END.encode()
_NUMBER_FORMATS: dict[str, str] = {
    "p_valid": "{:.4f}",
    "tokens_per_second_p10": "{:.6g}",
    "tokens_per_second_p50": "{:.6g}",
    "tokens_per_second_p90": "{:.6g}",
}


def _prediction_texts(predicted: pd.DataFrame) -> list[bytes]:
    """The PREDICTION_COLUMNS of every row as CSV text to follow the row's own cells (each cell after a
    comma), with the line ending. The rows are distinct configurations (`read_configs`); the texts among
    their cells (outcome, rule, note) are formatted once per distinct text, a few dozen."""
    if not len(predicted):
        return []
    outcome = each_distinct(
        np.array([str(o) for o in predicted["outcome"].to_numpy(dtype=object)], dtype=object),
        lambda text: _field(text).encode(),
    )
    rule = each_distinct(
        predicted["rule"].to_numpy(), lambda rule: _field(rule).encode() if isinstance(rule, str) else b""
    )
    # A note may quote the input (an unseen model's name): neutralised like the input's own cells.
    note = each_distinct(
        predicted["note"].to_numpy(),
        lambda note: _field(neutralise(note)).encode() if isinstance(note, str) else b"",
    )
    numbers = [
        pd.to_numeric(predicted[name], errors="coerce").to_numpy(dtype=float) for name in _NUMBER_FORMATS
    ]
    texts = [
        _PREDICTIONS_ROW % cells
        for cells in zip(
            outcome.tolist(),
            rule.tolist(),
            *(column.tolist() for column in numbers),
            note.tolist(),
            strict=True,
        )
    ]
    for row in np.flatnonzero(~np.isfinite(np.column_stack(numbers)).all(axis=1)).tolist():
        formatted = [
            _number(float(column[row]), fmt).encode()
            for column, fmt in zip(numbers, _NUMBER_FORMATS.values(), strict=True)
        ]
        texts[row] = b"," + b",".join([outcome[row], rule[row], *formatted, note[row]]) + _LINE_END.encode()
    return texts


def _field(text: str) -> str:
    """A cell as the csv module writes it (excel dialect, QUOTE_MINIMAL): quoted when it holds a comma, a
    quote or a line break."""
    if any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _number(number: float, fmt: str) -> str:
    """A number formatted, "" when it is not a finite number."""
    return fmt.format(number) if math.isfinite(number) else ""
