"""CSV cells a spreadsheet would run: a cell that starts with `=`, `+`, `-` or `@` (or a tab or carriage
return, which some spreadsheets skip before looking) is taken as a formula when the file is opened, and a
formula can fetch URLs or run commands (CSV injection). Such a cell is written with a leading `'`, which
spreadsheets show as text; a plain number such as `-1.5` or `+3` is left alone (a spreadsheet reads it as
the number it is).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import numpy as np

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
# finetwin's CSV inputs have a few dozen columns; a header with thousands is a mistake (and made reading
# quadratic), so readers refuse it before reading a row.
MAX_CSV_COLUMNS = 256
# A plain decimal number, as a spreadsheet reads one (not "-inf" or "-nan", which it would evaluate).
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def neutralise(cell: str) -> str:
    """The cell as text a spreadsheet will not evaluate."""
    if not cell.startswith(FORMULA_STARTS) or _NUMBER.fullmatch(cell):
        return cell
    return "'" + cell


def too_many_columns(count: int) -> str:
    return f"has {count:,} columns; at most {MAX_CSV_COLUMNS} are read"


def neutralise_row(cells: Iterable[object]) -> list[object]:
    """Every text cell of a row neutralised; numbers and other values as they are."""
    return [neutralise(c) if isinstance(c, str) else c for c in cells]


# A cell that may start as a formula, found in a row's text cells joined after a separator that CSV text does
# not hold: a search led by a literal runs in C at ~2 µs a row, where checking every cell in Python (or an
# alternation with ^) cost ~8-11 µs, more than the models on a 100,000-row `finetwin predict`.
_SEPARATOR = "\x1f"
_FORMULA_MARK = re.compile(re.escape(_SEPARATOR) + "[" + re.escape("".join(FORMULA_STARTS)) + "]")


def neutralise_texts(cells: list[str]) -> list[str]:
    """`neutralise_row` for a row of text cells, with one search for the rare row that needs it."""
    if _FORMULA_MARK.search(_SEPARATOR + _SEPARATOR.join(cells)) is None:
        return cells
    return [neutralise(c) for c in cells]


# The bytes (UTF-8) a formula may start with, as a lookup table. Not \r: in a CSV whose every row is one line,
# a \r is the line ending (\r\n), and a cell that begins there is an empty last cell.
_FORMULA_BYTES = np.zeros(256, dtype=bool)
_FORMULA_BYTES[[ord(c) for c in FORMULA_STARTS if c != "\r"]] = True


def may_start_formulas(text: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """For a CSV whose every row is one line, as UTF-8 bytes, and offsets where a cell may start (each before
    the text's end): which of them start with one of FORMULA_STARTS, after an opening quote if there is one.
    Whether such a cell is a formula is for `neutralise` to say."""
    first = text[starts]
    quoted = first == ord('"')
    # The text's last byte is no cell's opening quote: reading it again there finds no formula.
    first[quoted] = text[np.minimum(starts[quoted] + 1, len(text) - 1)]
    return _FORMULA_BYTES[first]
