"""What the commands print: rich consoles, tables and progress bars.

Tables and messages go through rich; JSON goes to stdout untouched (scripts parse it). Consoles are made
per call so they write to the `sys.stdout` / `sys.stderr` of the moment (pytest's capture swaps them).
Off a terminal, lines are not wrapped: a pipe or a log gets each message on one line.
"""

from __future__ import annotations

import os
import re
import select
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

WIDE = 200  # columns of a table printed to a pipe (rich would fold it at 80)


def console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream is None:  # started with the descriptor closed (`finetwin info >&-`): Python gives None
        stream = open(os.devnull, "w")  # noqa: SIM115 -- the console writes to it for the command's life
    return Console(
        file=stream,
        highlight=False,
        soft_wrap=True,
        width=None if stream.isatty() else WIDE,
    )


# Control characters but the line breaks and tabs a message may hold: a name from telemetry or a key's name
# could carry an escape sequence that recolours or rewrites the operator's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: object) -> Text:
    """A value as text printed as it is: never read as rich markup (a GPU named `acme [/x] accel` in
    telemetry made `finetwin forecast` end in a MarkupError traceback, and `deploy-bot [prod]` lost its
    `[prod]`), its control characters shown escaped (`\\x1b`)."""
    return Text(_CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value)))


def say(message: str, *, stderr: bool = False) -> None:
    """A line of plain text (no markup: messages carry paths and brackets)."""
    console(stderr=stderr).print(plain(message))


def error(command: str, message: str) -> None:
    """`finetwin COMMAND: error: MESSAGE` on stderr, without a traceback."""
    out = console(stderr=True)
    out.print(f"finetwin {command}: error: ", style="bold red", end="", markup=False)
    out.print(plain(message))


def table(columns: Sequence[str | tuple[str, str]], rows: Sequence[Sequence[Any]], **options: Any) -> Table:
    """A borderless table; a column given as (name, "right") is right-aligned (numbers)."""
    grid = Table(box=None, header_style="bold", pad_edge=False, **options)
    for column in columns:
        name, justify = column if isinstance(column, tuple) else (column, "left")
        # Long names (pools, SLOs) wrap instead of being cut to "NVIDIA-A100-S…" on a narrow terminal.
        grid.add_column(plain(name), justify=justify, overflow="fold")  # type: ignore[arg-type]
    for row in rows:
        grid.add_row(*(plain(cell) for cell in row))
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


def stdout_closed() -> bool:
    """Whether standard output's reader has gone (`finetwin ... | head`): then what is left to write is sent
    nowhere (Python's own flush at exit would say "Broken pipe" again), and the command ends quietly with
    status 1, as click ends one whose --help met a closed pipe. A broken pipe of anything else (a socket) is
    the machine's error, said as such."""
    if sys.stdout is None:  # started with its output closed: a broken pipe is something else's
        return False
    try:
        sys.stdout.flush()
        descriptor = sys.stdout.fileno()
    except BrokenPipeError:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # no real stdout (a test's capture): not a pipe a reader left
        return False
    # A pipe's writing end polls as an error once its reader has gone (its buffer may be empty by now).
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in poller.poll(0)):
        return False
    os.dup2(os.open(os.devnull, os.O_WRONLY), descriptor)
    return True
