"""Imported by the forkserver the twin's local pools fork their workers from, and only there
(`twin.executors.start_forkserver` preloads it): it makes the server ignore Ctrl-C before the server saves
the signal handlers it gives back to every process it forks, so each worker is born ignoring Ctrl-C, before
any of its code runs. Imported anywhere else it does nothing."""

from __future__ import annotations

import signal
import sys


def in_the_forkserver() -> bool:
    """Whether this import runs inside `multiprocessing.forkserver.main`, which imports its preload."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back
    return False


if in_the_forkserver():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
