"""`finetwin ingest --processes N`: N consumers of one group, each in a child process of its own.

One process applies its batches one at a time and its Python work (decoding, folding, the client's share of
the SQL) holds one GIL; the database and the broker then wait on it. N processes scale out the Kafka way, as
N `finetwin ingest` commands would: the group splits the partitions between them, so their jobs are
disjoint, and each has its own consumer, producer and database connections (bench/ingest.py measures 1
against N).

The parent only supervises: SIGTERM or Ctrl-C is passed on to every child, which drains its batch and
commits before it exits; a child that fails on its own stops the others, and the parent exits with its
status (a supervisor such as systemd or Kubernetes then restarts the whole unit).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import wait
from types import FrameType

from twin.lifeline import when_spawning_parent_gone

log = logging.getLogger(__name__)


def run_children(count: int, target: Callable[[int], object], name: str) -> int:
    """Run `target(i)` for i in 0..count-1, each in a child process, until all have exited; returns 0 when
    every child exited cleanly, else the first failure's exit status. `target` must pickle (the children
    are spawned: a fresh interpreter, nothing inherited from this process's threads or connections)."""
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=_child, args=(target, i), name=f"{name}-{i}") for i in range(count)]
    stopping = False

    def stop_all(signum: int | None = None, _frame: FrameType | None = None) -> None:
        nonlocal stopping
        if signum is not None:
            log.info("%s: stopping %d processes", signal.Signals(signum).name, count)
        stopping = True
        for child in children:
            if child.pid is not None and child.exitcode is None:
                os.kill(child.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for child in children:
            child.start()
        running = list(children)
        while running:
            ended = wait([child.sentinel for child in running])  # woken by a child's exit, not by a timer
            for child in [c for c in running if c.sentinel in ended]:
                child.join()
                running.remove(child)
                if child.exitcode != 0 and not stopping:
                    log.error("%s exited with status %s; stopping the others", child.name, child.exitcode)
                    status = status or _status(child.exitcode)
                    stop_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for child in children:  # only if this process itself is failing: never leave orphans behind
            if child.exitcode is None and child.pid is not None:
                child.kill()
                child.join()
    return status


def _child(target: Callable[[int], object], index: int) -> None:
    """A child's life: `target(index)`, stopped as SIGTERM stops it (its batch drained and committed) when
    the parent is gone, however it ended (`kill -9` runs no code that could pass a signal on): a consumer
    left behind would go on ingesting beside the ones a restarted unit starts."""
    when_spawning_parent_gone(lambda: os.kill(os.getpid(), signal.SIGTERM), f"finetwin-ingest-{index}-watch")
    target(index)


def _status(exitcode: int | None) -> int:
    """A child's exit status as a process exit status (killed by signal N: 128 + N, as a shell reports it)."""
    if exitcode is None:
        return 1
    return 128 - exitcode if exitcode < 0 else exitcode
