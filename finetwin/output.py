"""What the commands print: rich consoles, tables and progress bars.

Tables and messages go through rich; JSON goes to stdout untouched (scripts parse it). Consoles are made
per call so they write to the `sys.stdout` / `sys.stderr` of the moment (pytest's capture swaps them).
Off a terminal, lines are not wrapped: a pipe or a log gets each message on one line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

WIDE = 200  # columns of a table printed to a pipe (rich would fold it at 80)


def console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(
        file=stream,
        highlight=False,
        soft_wrap=True,
        width=None if stream.isatty() else WIDE,
    )


def say(message: str, *, stderr: bool = False) -> None:
    """A line of plain text (no markup: messages carry paths and brackets)."""
    console(stderr=stderr).print(message, markup=False)


def error(command: str, message: str) -> None:
    """`finetwin COMMAND: error: MESSAGE` on stderr, without a traceback."""
    out = console(stderr=True)
    out.print(f"finetwin {command}: error: ", style="bold red", end="", markup=False)
    out.print(message, markup=False)


def table(columns: Sequence[str | tuple[str, str]], rows: Sequence[Sequence[Any]], **options: Any) -> Table:
    """A borderless table; a column given as (name, "right") is right-aligned (numbers)."""
    grid = Table(box=None, header_style="bold", pad_edge=False, **options)
    for column in columns:
        name, justify = column if isinstance(column, tuple) else (column, "left")
        # Long names (pools, SLOs) wrap instead of being cut to "NVIDIA-A100-S…" on a narrow terminal.
        grid.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        grid.add_row(*(str(cell) for cell in row))
    return grid


def show(renderable: Any) -> None:
    console().print(renderable)


@contextmanager
def progress(
    total: int, what: str, unit: str, *, quiet: bool = False
) -> Iterator[Callable[..., object] | None]:
    """A progress bar on stderr for interactive use; yields `tick(n=1)`, or None in pipes and when quiet."""
    out = console(stderr=True)
    if quiet or not out.is_terminal:
        yield None
        return
    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
        TimeRemainingColumn(), console=out, transient=True,
    )  # fmt: skip
    with bar:
        task = bar.add_task(what, total=total)
        yield lambda n=1: bar.advance(task, n)
