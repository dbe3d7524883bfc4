"""Where a command may write its output: checked before any work is done, so that a mistake costs a clear
message (the CLI's exit status 2), never a traceback or a file silently replaced.

`check_output_file` for one file (`predict --output`), `check_output_dir` for a directory of known files
(`report --out`). Both refuse to replace what exists unless `force` (the CLI's `--force`), and even then
never a read-only file or a directory.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

_ANY_WRITE = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


class OutputPathError(ValueError):
    """An output path that cannot be used; the message names it and says what to do."""


def check_output_file(path: Path, *, force: bool = False) -> Path:
    """`path` if a new file may be written there: its directory exists or can be made, and it is not a
    directory, nor (without `force`) an existing file, nor (even with `force`) a read-only one."""
    if path.is_dir():
        raise OutputPathError(f"{path}: is a directory; give the name of a file to write")
    if path.exists() or path.is_symlink():
        if not force:
            raise OutputPathError(f"{path}: already exists; use --force to overwrite it")
        if not path.is_file():
            raise OutputPathError(f"{path}: is not a regular file; refusing to overwrite it")
        if not path.stat().st_mode & _ANY_WRITE:  # by its mode: root may write anything, yet should not here
            raise OutputPathError(f"{path}: is read-only; refusing to overwrite it even with --force")
    _check_parent(path.parent)
    return path


def check_output_dir(path: Path, files: Iterable[str], *, force: bool = False) -> Path:
    """`path` if the `files` (relative names) may be written into it: it is a directory or can be made,
    and (without `force`) none of the files is there yet."""
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{path}: is a file, not a directory; give a directory to write into")
    if path.is_dir():
        existing = sorted(name for name in files if (path / name).exists() or (path / name).is_symlink())
        if existing and not force:
            more = f" and {len(existing) - 1} more" if len(existing) > 1 else ""
            raise OutputPathError(
                f"{path}: already holds {existing[0]}{more}; use --force to overwrite, or another directory"
            )
        for name in existing:
            check_output_file(path / name, force=True)
    else:
        _check_parent(path.parent)
    return path


def _check_parent(directory: Path) -> None:
    """The nearest existing ancestor of `directory` must be a directory we may write in."""
    for ancestor in (directory, *directory.parents):
        if ancestor.exists():
            if not ancestor.is_dir():
                raise OutputPathError(f"{ancestor}: is a file, not a directory")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                raise OutputPathError(f"{ancestor}: cannot write there (permission denied)")
            return
