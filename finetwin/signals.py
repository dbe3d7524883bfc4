"""Stopping long-running commands cleanly on SIGTERM and Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, deadline_s: float | None = None) -> Iterator[None]:
    """SIGTERM and the first Ctrl-C set `stop` (the loops drain and return); a second Ctrl-C interrupts.
    With `deadline_s`, the process exits (status 1) if it is still running that long after the signal."""

    def request_stop(signum: int, _frame: Any) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        log.info("%s: stopping", signal.Signals(signum).name)
        if deadline_s is not None and not stop.is_set():
            watchdog = threading.Timer(deadline_s, _exit_now, args=(deadline_s,))
            watchdog.daemon = True
            watchdog.start()
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_now(deadline_s: float) -> None:
    log.error("not stopped %.0f s after the signal (a broker or database gone?): exiting now", deadline_s)
    logging.shutdown()
    os._exit(1)
