"""Why a CSV file lacks a column finetwin reads, where its header says: the file is separated by something
other than commas (an export in a locale that writes `;`, or tabs), or a name in it resembles the missing
column."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from twin.input_errors import closest, synonym_in

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
    `taken` (those it has as they should be), resembles the missing column, or ` (the header has 'seq_len':
    another name for it?)` where one is a synonym of it (`twin.input_errors.SYNONYMS`); else ''."""
    others = [name for name in header if name not in taken]
    same = synonym_in(column, others)
    if same is not None:
        return f" (the header has {same!r}: another name for it?)"
    close = closest(column, others)
    return f" (the header has {close!r}: misspelled?)" if close else ""
