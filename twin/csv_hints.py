"""Why a CSV file cannot be read as finetwin reads CSVs, where its text says: it is not UTF-8 (a
spreadsheet's export in a legacy encoding), it is separated by something other than commas (an export in a
locale that writes `;`, or tabs), or a name in its header resembles a missing column."""

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


def not_utf8(data: bytes) -> tuple[int, str] | None:
    """(line, message) of the first byte that is not UTF-8, None when the text is UTF-8. The line counted
    in the bytes themselves: a decoder reading ahead by blocks reports the line it had reached."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        near = (
            data[max(start, exc.start - 20) : exc.start + 20].decode("utf-8", errors="replace").split("\n")[0]
        )
        return line, (
            f"is not UTF-8 text (byte 0x{data[exc.start]:02x} in {near.strip()!r}): save the file as UTF-8 "
            "(in a spreadsheet: CSV UTF-8)"
        )
    return None
