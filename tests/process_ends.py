"""Awaiting the end of a process the test did not start (a grandchild: a pool worker, a consumer, a broker),
as an event: a pidfd turns readable when its process ends (Linux 5.3, `os.pidfd_open`)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

needs_pidfd = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs pidfd_open (Linux 5.3)")


@contextlib.contextmanager
def watching(pids: Iterable[int]) -> Iterator[dict[int, int]]:
    """pidfds of `pids` (opened now, before anything can end them and their ids be reused), closed after;
    those still running then are killed, so that a failing test leaves none behind."""
    handles = {pid: os.pidfd_open(pid) for pid in pids}
    try:
        yield handles
    finally:
        for handle in handles.values():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(handle, signal.SIGKILL)
            os.close(handle)


def still_running(handles: dict[int, int], timeout_s: float) -> list[int]:
    """Wait until every watched process has ended, or `timeout_s`; the ids of those still running."""
    deadline = time.monotonic() + timeout_s
    waiting = dict(handles)
    while waiting and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(list(waiting.values()), [], [], left)
        waiting = {pid: handle for pid, handle in waiting.items() if handle not in readable}
    return sorted(waiting)


def children_of(pid: int) -> list[int]:
    """The ids of a running process's children (Linux's /proc)."""
    return [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
