"""Why a CSV file lacks a column finetwin reads, where its header says: the file is separated by something
other than commas (an export in a locale that writes `;`, or tabs), or a name in it resembles the missing
column."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from twin.input_errors import closest

# Separators a spreadsheet or a database export may use instead of the comma, as a message names them.
_OTHER_SEPARATORS = {";": "';'", "\t": "tabs", "|": "'|'"}


def separator_hint(header: Sequence[str]) -> str:
    """`the header is one column with ';' in it: ...` when the whole header read as one name holding another
    separator; else ''. Said instead of which columns are missing: they all are, and the fix is one."""
    if len(header) != 1:
        return ""
    for separator, name in _OTHER_SEPARATORS.items():
        if separator in header[0]:
            return (
                f"the header is one column with {name} in it: the file looks separated by {name}, and "
                "finetwin reads comma-separated files"
            )
    return ""


def resembling(column: str, header: Sequence[str], taken: Collection[str] = ()) -> str:
    """` (the header has 'gpu': misspelled?)` where a name of the header, other than the columns in
    `taken` (those it has as they should be), resembles the missing column; else ''."""
    close = closest(column, [name for name in header if name not in taken])
    return f" (the header has {close!r}: misspelled?)" if close else ""
