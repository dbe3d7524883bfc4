"""The fast CSV paths of `finetwin predict` (issue 14): a plain file is read by pandas' C parser and written
back line by line, anything else by the csv module. Both must give what the csv module alone gave: the same
cells, the same line in every error, the same output cells."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from calibrate import loader
from calibrate.columns import PREDICT_REQUIRED_COLUMNS
from calibrate.loader import BENCHMARK_COLUMNS, BenchmarkFormatError
from calibrate.predict import PREDICTION_COLUMNS, configs_in_chunks, read_configs, write_predictions
from twin.csv_cells import neutralise, neutralise_row, neutralise_texts

ROW = {
    "method": "full", "model_name": "llama3-8b", "number_nodes": "1", "gpu_model": "NVIDIA-A100-SXM4-80GB",
    "number_gpus": "4", "tokens_per_sample": "2048", "batch_size": "16", "enable_roce": "0",
    "fast_moe": "0", "fast_kernels": "",
}  # fmt: skip
COLUMNS = ["extra", *ROW, "other"]  # a free cell first: formulas at a line's start, and after a comma
# Cells that a spreadsheet would run, plain numbers it would not, and cells CSV has to quote.
TRICKY = ["=1+1", "-x", "@a", "+3", "-1.5", "\tx", "=SUM(A1,B1)", "a,b", 'say "hi"', "", " ", "é", "-"]


class Stub:
    """A model whose predictions exercise every kind of prediction cell."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def predict_frame(self, table: pd.DataFrame, *, distinct: bool = False) -> pd.DataFrame:
        n = len(table)
        pick = np.random.default_rng(self.seed).integers(0, 1 << 16, size=n)
        notes = np.array(["", "'lama3' is new, \"see\" docs", "=evil()", "two\nlines", "plain"], dtype=object)
        numbers = np.array([0.25, -0.0, 0.0, np.nan, np.inf, 1234567.891, 1e-7, -2.5])
        return pd.DataFrame(
            {
                "outcome": np.array(["valid", "runtime", "rejected"])[pick % 3],
                "rule": np.array([None, "divisibility", "a,b"], dtype=object)[pick % 3],
                "p_valid": numbers[pick % 8],
                "tokens_per_second_p10": numbers[(pick >> 3) % 8],
                "tokens_per_second_p50": numbers[(pick >> 6) % 8],
                "tokens_per_second_p90": numbers[(pick >> 9) % 8],
                "note": np.array([None, *notes], dtype=object)[pick % 6],
            }
        )


def old_output(path: Path, predicted: pd.DataFrame) -> str:
    """What `write_predictions` wrote before the fast paths: every row through the csv module."""
    frame = loader._read_with_csv_module(path, path.read_bytes(), PREDICT_REQUIRED_COLUMNS)
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(neutralise_row([*frame.raw.columns, *PREDICTION_COLUMNS]))
    for cells, added in zip(frame.raw.to_numpy().tolist(), old_prediction_cells(predicted), strict=True):
        writer.writerow([*neutralise_texts(cells), *added])
    return buffer.getvalue()


def old_prediction_cells(predicted: pd.DataFrame) -> list[tuple[str, ...]]:
    def numbers(values: pd.Series, fmt: str) -> list[str]:
        floats = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
        return [fmt.format(x) if np.isfinite(x) else "" for x in floats.tolist()]

    columns = [
        [str(outcome) for outcome in predicted["outcome"]],
        [rule if isinstance(rule, str) else "" for rule in predicted["rule"]],
        numbers(predicted["p_valid"], "{:.4f}"),
        *(numbers(predicted[f"tokens_per_second_{p}"], "{:.6g}") for p in ("p10", "p50", "p90")),
        [neutralise(note) if isinstance(note, str) else "" for note in predicted["note"]],
    ]
    return list(zip(*columns, strict=True))


def configs_text(extras: list[tuple[str, str]], ending: str = "\n", blank_after: int | None = None) -> str:
    """A configs CSV as the csv module writes it, with a blank line after data row `blank_after`."""
    lines = [csv_line(COLUMNS)]
    for i, (extra, other) in enumerate(extras):
        lines.append(csv_line([extra, *ROW.values(), other]))
        if i == blank_after:
            lines.append("")
    return "".join(line + ending for line in lines)


def csv_line(row: list[str]) -> str:
    """A row as the csv module writes it, without its line ending (written with CRLF: with another ending the
    csv module would leave a cell's CR unquoted)."""
    buffer = io.StringIO(newline="")
    csv.writer(buffer).writerow(row)
    return buffer.getvalue().removesuffix("\r\n")


def predict_both(path: Path, seed: int = 0) -> tuple[bytes, str]:
    """(what write_predictions writes now, what it wrote before) for one input file."""
    configs = read_configs(path)
    output = path.with_name("pred.csv")
    write_predictions(Stub(seed), configs, output)
    every_row = Stub(seed).predict_frame(configs.table).iloc[configs.rows]
    return output.read_bytes(), old_output(path, every_row)


def cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def read_outcome(read: Any) -> tuple[Any, ...]:
    try:
        frame = read()
    except BenchmarkFormatError as exc:
        return ("error", str(exc), exc.line, exc.column)
    return ("rows", list(frame.raw.columns), frame.raw.to_numpy().tolist(), frame.lines.tolist())


@pytest.fixture
def no_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file must be read by the fast path: the csv module's reader would fail the test."""

    def refuse(path: Path, data: bytes, required: tuple[str, ...]) -> None:
        raise AssertionError(f"{path} was read by the csv module, not the fast path")

    monkeypatch.setattr(loader, "_read_with_csv_module", refuse)


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_the_tricky_cells_come_out_as_the_csv_module_wrote_them(tmp_path: Path, ending: str) -> None:
    extras = [(cell, TRICKY[(i + 5) % len(TRICKY)]) for i, cell in enumerate(TRICKY)]
    path = tmp_path / "configs.csv"
    path.write_bytes(configs_text(extras, ending, blank_after=3).encode())
    configs = read_configs(path)
    assert configs.written.records is not None  # the fast path
    assert "extra" not in configs.table.columns  # read from the lines, not parsed as cells
    new, old = predict_both(path)
    assert new == old.encode()  # byte for byte: the input was quoted as the csv module quotes
    written = cells(new.decode())
    assert written[1 + TRICKY.index("=1+1")][0] == "'=1+1"
    assert written[1 + TRICKY.index("-1.5")][0] == "-1.5"
    assert written[1 + TRICKY.index("a,b")][0] == "a,b"


def test_a_quoted_line_break_takes_the_csv_module_and_writes_the_same_cells(tmp_path: Path) -> None:
    path = tmp_path / "configs.csv"
    path.write_bytes(configs_text([("two\nlines", "=1+1"), ("-x", "plain"), ("a,b", "")], "\r\n").encode())
    assert read_configs(path).written.records is None  # the csv module's path
    new, old = predict_both(path)
    assert new == old.encode()


@pytest.mark.parametrize("block_rows", [1, 2, 5])
@pytest.mark.parametrize("line_break", [False, True], ids=["fast path", "csv module"])
def test_rows_written_a_block_at_a_time_are_the_rows_written_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_rows: int, line_break: bool
) -> None:
    """The output is written WRITE_BLOCK_ROWS rows at a time (a large file's joined output doubled its
    memory): every row once, in order, its neutralised cells in its own place, whatever the block size."""
    from calibrate import predict

    monkeypatch.setattr(predict, "WRITE_BLOCK_ROWS", block_rows)
    extras = [(cell, TRICKY[(i + 5) % len(TRICKY)]) for i, cell in enumerate(TRICKY)]
    if line_break:
        extras.append(("two\nlines", "=1+1"))
    path = tmp_path / "configs.csv"
    path.write_bytes(configs_text(extras, "\r\n", blank_after=3).encode())
    assert (read_configs(path).written.records is None) == line_break
    new, old = predict_both(path)
    assert new == old.encode()


def test_cells_quoted_without_need_are_kept_as_written_and_read_the_same(tmp_path: Path) -> None:
    """Kept verbatim, "abc" stays quoted where the csv module would drop the quotes: the same cells."""
    header = ",".join(COLUMNS)
    row = ",".join(ROW.values())
    lines = [header, f'"abc",{row},"-1"', f'"=x",{row},""""', "", f'"",{row},x']
    path = tmp_path / "configs.csv"
    path.write_text("\n".join(lines) + "\n")
    assert read_configs(path).written.records is not None
    new, old = predict_both(path)
    assert cells(new.decode()) == cells(old)
    assert b'"abc"' in new  # as written


@pytest.mark.parametrize("ending", ["\n", "\r\n"])
def test_an_error_after_a_blank_line_names_its_line_on_the_fast_path(
    tmp_path: Path, ending: str, no_slow_path: None
) -> None:
    rows = [",".join(COLUMNS)] + [",".join(["x", *ROW.values(), "y"])] * 3
    rows[3] = rows[3].replace(",16,", ",sixteen,")  # batch_size of data row 3, on line 5 after the blank
    rows.insert(2, "")
    path = tmp_path / "configs.csv"
    path.write_bytes((ending.join(rows) + ending).encode())
    with pytest.raises(BenchmarkFormatError) as caught:
        read_configs(path)
    assert (caught.value.line, caught.value.column) == (5, "batch_size")


def test_the_benchmark_names_the_same_lines_on_the_fast_path(
    tmp_path: Path, sample_csv: Path, no_slow_path: None
) -> None:
    """The real sample (quoted lists in its cells) with Windows line endings and two blank lines: every row
    keeps its line, and a bad cell on line 60 is named there."""
    lines = sample_csv.read_text().splitlines()
    lines[10:10] = [""]
    lines[30:30] = [""]
    path = tmp_path / "bench.csv"
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    table = loader.load_benchmark(path)
    assert table["line"].tolist() == [i + 1 for i, line in enumerate(lines) if i and line]
    (row,) = cells(lines[59])
    row[BENCHMARK_COLUMNS.index("is_valid")] = "3"
    lines[59] = csv_line(row)
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode())
    with pytest.raises(BenchmarkFormatError) as caught:
        loader.load_benchmark(path)
    assert (caught.value.line, caught.value.column) == (60, "is_valid")


@pytest.mark.parametrize(
    ("text", "fast"),
    [
        ("a,b,c\n1,2,3\n\n4,5,6", True),  # no line ending at the end
        ("a,b,c\r\n1,2,3\r\n\r\n", True),
        ("a,b,c\n", True),  # a header alone
        ("a,b,c\n\n\n", True),
        ('"a","b",c\n"1,2","""",3\n', True),
        ("a,b,c\n\ufeff1,2,3\n", True),  # a byte-order mark is a cell's text after the first line
        ("\ufeffa,b,c\n1,2,3\n", True),  # but the file's first: a spreadsheet's mark, not the name's text
        ("\ufeff\ufeffa,b,c\n1,2,3\n", True),  # one mark; a second is the name's text
        ("a,b,c\n1,2,3,4\n", False),  # has 4 fields
        ("a,b,c\n1,2\n", False),
        ("a,b,c\n   \n1,2,3\n", False),  # a line of spaces: skipped by the csv path's own rule
        ("a,b,c\n\x0c\n1,2,3\n", False),
        ('a,b,c\n""\n1,2,3\n', False),
        ('a,b,c\n1,"two\nlines",3\n4,5,6\n', False),
        ('a,b,c\n1,2,"x\ny",3,4\n', False),  # a quoted line break where each line has three fields
        ('a,b,c\n1,x"y,3\n', False),  # a quote inside a cell
        ('a,b,c\n1,x"a,b",3\n', False),  # the csv module reads 4 cells: x"a and b"
        ('a,b,c\n1,"x"y,3\n', False),  # text after a closing quote
        ('a,b,c\n1, "x",3\n', False),
        ("a,b,c\n1,2\r3\n", False),  # a lone carriage return: a line break to the csv module
        ("a,b,c\n1,\x00,3\n", False),
        ("a,a,b\n1,2,3\n", True),  # the header's errors, from either path
        ("a,c\n1,2\n", True),
        ("", True),  # "empty file"
    ],
)
def test_plain_files_take_the_fast_path_and_read_the_same(tmp_path: Path, text: str, fast: bool) -> None:
    path = tmp_path / "edge.csv"
    path.write_bytes(text.encode())
    outcome = read_outcome(lambda: loader._read(path, ("a", "b")))
    assert outcome == read_outcome(lambda: loader._read_with_csv_module(path, path.read_bytes(), ("a", "b")))
    assert fast_path_takes(path) == fast


@pytest.mark.parametrize(
    "data",
    [
        b"a,b,c\n1,2,3\n4,\xff,6\n",
        b"a,b,c\n1,2,3\n" * 2000 + b"4,\xff,6\n",  # beyond the first chunk the csv path decodes
        b"a,b,c\n1," + b"x" * (csv.field_size_limit() + 1) + b",3\n",
    ],
)
def test_what_the_csv_module_cannot_read_is_its_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(data)
    assert not fast_path_takes(path)
    outcome = read_outcome(lambda: loader._read(path, ("a", "b")))
    assert outcome[0] == "error" and outcome == read_outcome(
        lambda: loader._read_with_csv_module(path, path.read_bytes(), ("a", "b"))
    )


def fast_path_takes(path: Path) -> bool:
    try:
        return loader._read_plain(path, path.read_bytes(), ("a", "b"), with_records=False) is not None
    except BenchmarkFormatError:  # the header's, raised there as the csv path raises it
        return True


def quoted(alphabet: str) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, max_size=4).map(lambda text: '"' + text.replace('"', '""') + '"')


UNQUOTED = st.text(alphabet="ab =-@\t\x0cé", max_size=4)
ONE_LINE_CELLS = UNQUOTED | quoted('ab,"= é')
ANY_CELLS = st.one_of(UNQUOTED, quoted('ab,"\r\n =é'), st.text(alphabet='ab,"\r\n \x00', max_size=3))


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    """Half plain (rows of the header's three cells, quoted or not, on one line each), half anything."""
    plain = draw(st.booleans())
    cell = ONE_LINE_CELLS if plain else ANY_CELLS
    width = st.just(3) if plain else st.integers(0, 4)
    row = width.flatmap(lambda n: st.lists(cell, min_size=n, max_size=n).map(",".join))
    rows = draw(st.lists(row | st.just(""), max_size=6))
    ending = draw(st.sampled_from(["\n", "\r\n"]))
    return ("a,b,c" + "".join(ending + r for r in rows) + draw(st.sampled_from(["", ending]))).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(csv_files())
def test_any_file_reads_as_the_csv_module_reads_it(tmp_path: Path, data: bytes) -> None:
    """Whichever path takes it, a file gives the csv module's cells and lines, or its error."""
    path = tmp_path / "any.csv"
    path.write_bytes(data)
    fast = read_outcome(lambda: loader._read(path, ("a", "b")))
    assert fast == read_outcome(lambda: loader._read_with_csv_module(path, data, ("a", "b")))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(csv_files())
def test_a_file_parsed_beside_its_lines_reads_as_the_csv_module_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: bytes
) -> None:
    """What a large file takes (pandas in a thread while its lines are found), on any file, every column or
    some: the csv module's cells of those columns, or its error."""
    monkeypatch.setattr(loader, "_OVERLAP_FROM_BYTES", 0)
    path = tmp_path / "any.csv"
    path.write_bytes(data)
    expected = read_outcome(lambda: loader._read_with_csv_module(path, data, ("a", "b")))
    assert read_outcome(lambda: loader._read(path, ("a", "b"))) == expected
    some = read_outcome(lambda: loader._read(path, ("a", "b"), columns=("c", "a")))
    if expected[0] == "rows" and some[1] != expected[1]:  # the fast path: columns a and c, in file order
        assert some[1] == ["a", "c"]
        assert some[2] == [[row[0], row[2]] for row in expected[2]] and some[3] == expected[3]
    else:
        assert some == expected


EXTRA_CELLS = st.sampled_from(TRICKY) | st.text(alphabet='-=+@\t,"é x1.', max_size=5)
OTHER_CELLS = st.text(alphabet='-=+@\t,"\r\né x1.', max_size=5)  # line breaks: the csv module's path


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(EXTRA_CELLS, OTHER_CELLS), max_size=8),
    st.sampled_from(["\n", "\r\n"]),
    st.integers(0, 8),
    st.integers(0, 1000),
)
def test_any_cells_are_written_as_the_csv_module_wrote_them(
    tmp_path: Path, extras: list[tuple[str, str]], ending: str, blank: int, seed: int
) -> None:
    path = tmp_path / "configs.csv"
    path.write_bytes(configs_text(extras, ending, blank_after=blank).encode())
    new, old = predict_both(path, seed)
    assert new == old.encode()
    records = read_configs(path).written.records
    if records is not None:  # each record reads back as its row's cells
        frame = loader._read_with_csv_module(path, path.read_bytes(), PREDICT_REQUIRED_COLUMNS)
        for start, end, row in zip(records.starts, records.ends, frame.raw.to_numpy().tolist(), strict=True):
            assert cells(records.text[start:end].decode()) == [row]


def test_each_configuration_is_predicted_once_and_every_row_gets_its_own(tmp_path: Path) -> None:
    """Rows that repeat a configuration (only the columns a prediction reads count) share one prediction;
    the summary counts rows, not configurations."""
    other = {**ROW, "batch_size": "32"}
    rows = [("a", ROW, "x"), ("b", other, "y"), ("c", ROW, "z"), ("d", ROW, "x"), ("e", other, "w")]
    path = tmp_path / "configs.csv"
    lines = [",".join(COLUMNS)] + [",".join([e, *r.values(), o]) for e, r, o in rows]
    path.write_text("\n".join(lines) + "\n")
    configs = read_configs(path)
    assert len(configs.table) == 2 and configs.rows.tolist() == [0, 1, 0, 0, 1]
    output = tmp_path / "pred.csv"
    summary = write_predictions(Stub(3), configs, output)
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert written["extra"].tolist() == ["a", "b", "c", "d", "e"]
    by_row = written[list(PREDICTION_COLUMNS)].to_numpy().tolist()
    assert by_row[0] == by_row[2] == by_row[3] and by_row[1] == by_row[4]
    assert summary.rows == 5 and sum(summary.outcomes.values()) == 5
    assert summary.outcomes == written["outcome"].value_counts().to_dict()
    assert summary.flagged == int((written["note"] != "").sum())


def test_a_bad_configuration_is_named_at_the_first_row_that_holds_it(tmp_path: Path) -> None:
    bad = {**ROW, "number_gpus": "0"}
    rows = [ROW, {**ROW, "batch_size": "32"}, ROW, bad, ROW, bad]
    path = tmp_path / "configs.csv"
    path.write_text("\n".join([",".join(COLUMNS)] + [",".join(["x", *r.values(), "y"]) for r in rows]) + "\n")
    with pytest.raises(BenchmarkFormatError) as caught:
        read_configs(path)
    assert (caught.value.line, caught.value.column) == (5, "number_gpus")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(EXTRA_CELLS, OTHER_CELLS), min_size=1, max_size=12),
    st.sampled_from(["\n", "\r\n"]),
    st.integers(0, 12),
    st.integers(1, 400),
)
def test_a_large_file_read_a_part_at_a_time_is_predicted_as_read_whole(
    tmp_path: Path, extras: list[tuple[str, str]], ending: str, blank: int, chunk_bytes: int
) -> None:
    """Parts end only where a row ends (never at a line break inside a quoted cell), every row comes out
    once and in order, as the file read whole gives it: whatever the part size, down to a byte."""
    path = tmp_path / "configs.csv"
    path.write_bytes(configs_text(extras, ending, blank_after=blank).encode())
    whole, parts = tmp_path / "whole.csv", tmp_path / "parts.csv"
    assert write_predictions(Stub(), read_configs(path), whole) == write_predictions(
        Stub(), configs_in_chunks(path, chunk_bytes), parts
    )
    assert parts.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("chunk_bytes", [1, 150, 700])
def test_a_bad_cell_in_a_later_part_is_named_at_its_line_in_the_file(
    tmp_path: Path, chunk_bytes: int
) -> None:
    """Lines before the part count as the csv module counts them: quoted line breaks and a lone CR too."""
    rows = [csv_line(["x", *ROW.values(), "y"]) for _ in range(6)]
    rows[2] = csv_line(["two\nlines", *ROW.values(), "a\rb"])  # three lines to the csv module
    bad = csv_line(["x", *{**ROW, "number_gpus": "four"}.values(), "y"])
    path = tmp_path / "configs.csv"
    path.write_bytes(("\r\n".join([csv_line(COLUMNS), *rows, bad, *rows]) + "\r\n").encode())
    with pytest.raises(BenchmarkFormatError) as whole:
        read_configs(path)
    with pytest.raises(BenchmarkFormatError) as in_parts:
        list(configs_in_chunks(path, chunk_bytes))
    assert (
        (in_parts.value.line, in_parts.value.column)
        == (whole.value.line, whole.value.column)
        == (10, "number_gpus")
    )
    assert str(in_parts.value) == str(whole.value)


@pytest.mark.parametrize("chunk_bytes", [1, 60, 200, 5000])
def test_a_stray_quote_cannot_make_a_part_end_inside_a_quoted_cell(tmp_path: Path, chunk_bytes: int) -> None:
    """A quote inside an unquoted cell (the csv module reads it as text) makes the quotes before a line break
    inside a later quoted cell even: a part may end there. Such a part is not plain, and it is read again
    with the rest of the file, so the rows come out as read whole."""
    plain = ",".join(["x", *ROW.values(), "y"])
    lines = [",".join(COLUMNS), plain, plain, ",".join(['ab"c', *ROW.values(), "y"])]
    lines += [",".join(['"two\nlines"', *ROW.values(), "y"]), plain]
    lines += [plain] * 5
    path = tmp_path / "configs.csv"
    path.write_bytes(("\n".join(lines) + "\n").encode())
    whole, parts = tmp_path / "whole.csv", tmp_path / "parts.csv"
    assert write_predictions(Stub(), read_configs(path), whole) == write_predictions(
        Stub(), configs_in_chunks(path, chunk_bytes), parts
    )
    assert parts.read_bytes() == whole.read_bytes()


@pytest.mark.parametrize("quote", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 1, 150])
def test_a_spreadsheets_utf8_export_reads_as_the_file_without_its_mark(
    tmp_path: Path, quote: bool, chunk_bytes: int | None
) -> None:
    """Excel's "CSV UTF-8" starts the file with a byte-order mark: the first column's name read as
    '\\ufeffextra' (and as '\\ufeffmethod', missing, where the configuration came first). Read whole or a
    part at a time, by the fast path or (a quoted line break) the csv module: the same rows, the same output
    as the file without it."""
    extras = [("a", "x"), ("two\nlines" if quote else "b", "y"), ("=1+1", "z")]
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_bytes(configs_text(extras, "\r\n").encode())
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    outputs = []
    for path in (plain, marked):
        output = tmp_path / f"{path.stem}-predicted.csv"
        parts = read_configs(path) if chunk_bytes is None else configs_in_chunks(path, chunk_bytes)
        write_predictions(Stub(), parts, output)
        outputs.append(output.read_bytes())
    assert outputs[1] == outputs[0]
    assert cells(outputs[1].decode())[0][0] == "extra"


def test_configurations_first_in_a_marked_file_are_found(tmp_path: Path) -> None:
    path = tmp_path / "marked.csv"
    path.write_bytes(b"\xef\xbb\xbf" + (",".join(ROW) + "\n" + ",".join(ROW.values()) + "\n").encode())
    configs = read_configs(path)
    assert configs.header == list(ROW)
    assert configs.table["model_name"].tolist() == ["llama3-8b"]
