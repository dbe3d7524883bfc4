"""The library checks the CLI calls before writing (twin.output_files) and the CSV cell neutralisation
(twin.csv_cells): unit tests on real files in a temporary directory."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from twin.csv_cells import neutralise, neutralise_row, neutralise_texts
from twin.output_files import OutputPathError, check_output_dir, check_output_file


def test_a_new_file_may_be_written_and_its_directory_made(tmp_path: Path) -> None:
    assert check_output_file(tmp_path / "out.csv") == tmp_path / "out.csv"
    assert check_output_file(tmp_path / "new" / "dir" / "out.csv").name == "out.csv"


def test_an_existing_file_needs_force(tmp_path: Path) -> None:
    existing = tmp_path / "out.csv"
    existing.write_text("keep me")
    with pytest.raises(OutputPathError, match="already exists; use --force"):
        check_output_file(existing)
    assert check_output_file(existing, force=True) == existing
    assert existing.read_text() == "keep me"  # checking writes nothing


def test_a_read_only_file_is_not_replaced_even_with_force(tmp_path: Path) -> None:
    existing = tmp_path / "out.csv"
    existing.write_text("keep me")
    existing.chmod(0o444)
    with pytest.raises(OutputPathError, match="read-only"):
        check_output_file(existing, force=True)


def test_a_directory_or_a_file_in_the_way_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputPathError, match="is a directory"):
        check_output_file(tmp_path, force=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        check_output_file(tmp_path / "file" / "out.csv")
    with pytest.raises(OutputPathError, match="is a file, not a directory"):
        check_output_dir(tmp_path / "file", ["report.md"], force=True)


def test_a_directory_holding_an_earlier_output_needs_force(tmp_path: Path) -> None:
    (tmp_path / "unrelated.txt").write_text("")
    assert check_output_dir(tmp_path, ["report.md", "numbers.json"]) == tmp_path  # nothing of ours there
    (tmp_path / "numbers.json").write_text("{}")
    (tmp_path / "report.md").write_text("#")
    with pytest.raises(OutputPathError, match=r"already holds numbers.json and 1 more; use --force"):
        check_output_dir(tmp_path, ["report.md", "numbers.json"])
    assert check_output_dir(tmp_path, ["report.md", "numbers.json"], force=True) == tmp_path
    assert check_output_dir(tmp_path / "new", ["report.md"]) == tmp_path / "new"


@pytest.mark.parametrize(
    ("cell", "written"),
    [
        ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
        ("\t=1+1", "'\t=1+1"),
        ("-inf", "'-inf"),
        ("-1.5", "-1.5"),
        ("+3", "+3"),
        ("-1e-05", "-1e-05"),
        ("llama3-8b", "llama3-8b"),
        ("", ""),
    ],
)
def test_cells_a_spreadsheet_would_run_are_written_as_text(cell: str, written: str) -> None:
    assert neutralise(cell) == written


def test_a_neutralised_row_reads_back_as_text(tmp_path: Path) -> None:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(neutralise_row(["=1+1", 4, "-4", None]))
    assert next(csv.reader(io.StringIO(buffer.getvalue()))) == ["'=1+1", "4", "-4", ""]


@given(st.lists(st.text(alphabet="=+-@\t\r\x1fab1.,'\" ", max_size=6), max_size=6))
def test_the_one_search_per_row_neutralises_exactly_what_each_cell_would(cells: list[str]) -> None:
    """predict's fast path (one search over the joined row) agrees with checking every cell."""
    assert neutralise_texts(cells) == neutralise_row(cells)
