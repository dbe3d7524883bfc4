"""A refit in a process of its own, at a lower CPU priority than the API that schedules it.

In the API's process, a refit's fits took the cores from the requests: `bench/refit_latency.py` measured
`POST /v1/advise` (new configurations, 20 requests/s) at p99 13 ms outside a refit and 412 ms during one
(17 s on the bundled sample; hourly, and at once on drift). In a child process niced by `REFIT_NICE`, the
kernel gives the requests the cores first and the refit what is left.

The child is the leader of its own process group, with the comparison's workers it starts: `stop` ends
them all as a Ctrl-C would (the API stopping), and the child ends them too if the API's process dies. A
terminal's Ctrl-C reaches the API alone, which stops the child through `stop` as it shuts down.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import traceback
from collections.abc import Callable
from typing import Any

from twin.lifeline import when_spawning_parent_gone

# 10 of 19: the requests win the CPU whenever they want it, and an idle machine still refits at full speed.
REFIT_NICE = 10
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # finetwin.logs' format


class RefitFailed(Exception):
    """The child's calibration raised: its message, with the child's traceback to log."""

    def __init__(self, message: str, child_traceback: str) -> None:
        super().__init__(message)
        self.child_traceback = child_traceback


class RefitProcess:
    """Runs one refit at a time in a spawned child process; `stop` ends the one running and refuses more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None  # once it takes SIGINT as a stop
        self._stopping = False
        self.spawned = threading.Event()  # set while a child process exists, ready or not
        self.started = threading.Event()  # set while a child runs that `stop` can signal

    def run(self, target: Callable[..., Any], database_url: str | None, **kwargs: Any) -> Any:
        """`target(engine=<an engine on database_url>, **kwargs)` in the child (a module-level function, so
        that the child imports it); its result, or its exception as `RefitFailed` (`KeyboardInterrupt` when
        it was stopped)."""
        context = multiprocessing.get_context("spawn")  # safe from a process with threads, as the API is
        receiving, sending = context.Pipe(duplex=False)
        level = logging.getLogger("calibrate").getEffectiveLevel()
        process = context.Process(
            target=_child, args=(sending, target, database_url, level, kwargs), name="finetwin-refit"
        )
        if self._stopping:
            raise KeyboardInterrupt  # stopped for good: the API is stopping
        # A process that exits while the child runs (its main thread ended, the child's not stopped) would
        # wait for the child at exit, as multiprocessing joins its children: stop it first.
        atexit.register(self.stop)
        process.start()
        sending.close()  # the child holds the only writer: its death ends recv with EOFError
        self.spawned.set()
        try:
            try:
                # A SIGINT before the child is ready would kill it or, inherited as ignored, be lost: `stop`
                # signals only a child that said it is ready, and one asked for before is sent then.
                kind, payload = receiving.recv()
                if kind == "ready":
                    with self._lock:
                        self._process = process
                        if self._stopping:
                            _interrupt(process)
                    self.started.set()
                    kind, payload = receiving.recv()
            except EOFError:
                kind, payload = "died", None
        finally:
            process.join()
            receiving.close()
            with self._lock:
                self._process = None
            self.started.clear()
            self.spawned.clear()
            atexit.unregister(self.stop)
        if kind == "done":
            return payload
        # Stopped, a child that died or failed was interrupted: a library may turn the KeyboardInterrupt into
        # an error of its own (numpy, mid-fit: "not a valid PEP 3118 buffer format string" from it), which
        # was logged as a failed refit with its traceback each time the API stopped during one.
        if kind == "interrupted" or (kind in ("died", "failed") and self._stopping):
            raise KeyboardInterrupt
        if kind == "died":
            died = f"the refit's process ended without an answer (exit code {process.exitcode})"
            raise RefitFailed(died, "")
        message, child_traceback = payload
        raise RefitFailed(message, child_traceback)

    @property
    def pid(self) -> int | None:
        """The running child's process id, once it is ready."""
        with self._lock:
            return None if self._process is None else self._process.pid

    def stop(self) -> None:
        """Ends the running child and its workers (SIGINT to their group), now or as soon as it is ready."""
        with self._lock:
            self._stopping = True
            if self._process is not None:
                _interrupt(self._process)


def _interrupt(process: multiprocessing.process.BaseProcess) -> None:
    """SIGINT to a ready child's group: the child and the workers it started."""
    if process.pid is not None:
        with contextlib.suppress(ProcessLookupError):  # it has just ended
            os.killpg(process.pid, signal.SIGINT)


def _child(
    sending: multiprocessing.connection.Connection,
    target: Callable[..., Any],
    database_url: str | None,
    level: int,
    kwargs: dict[str, Any],
) -> None:
    os.setpgid(0, 0)
    # SIGINT is how it is stopped, also when the API was started with it ignored (in the background of a
    # script), which a child inherits; the workers it starts inherit this.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _end_with_parent()
    with contextlib.suppress(OSError):
        os.nice(REFIT_NICE)
    logging.basicConfig(level=logging.WARNING, format=_LOG_FORMAT)
    logging.getLogger("calibrate").setLevel(level)
    engine = None
    try:
        sending.send(("ready", None))
        if database_url is not None:
            from twin.db import make_engine

            engine = make_engine(database_url)
        sending.send(("done", target(engine=engine, **kwargs)))
    except KeyboardInterrupt:
        sending.send(("interrupted", None))
    except BaseException as exc:  # everything goes back to the API, which logs it
        sending.send(("failed", (str(exc) or type(exc).__name__, traceback.format_exc())))
    finally:
        if engine is not None:
            engine.dispose()
        sending.close()


def _end_with_parent() -> None:
    """End this process's group (this process and the workers it started) when the API's process is gone: a
    refit nobody waits for would still write a version."""
    when_spawning_parent_gone(lambda: os.killpg(0, signal.SIGINT), "finetwin-refit-parent-watch")
