"""Child processes that end with the process they work for, however it ends.

A process killed with SIGKILL (the kernel's out-of-memory killer, `kill -9`) runs no code of its own, so it
cannot stop its children: before this, the twin's pool workers, their forkserver and `finetwin ingest
--processes`' consumers went on without it, each holding its memory (a worker its copy of the models and
the workload) for as long as the machine ran. Each child therefore watches a pipe whose only writer is the
process it works for and which nobody writes to: the kernel closes that writer when the process ends, so the
pipe's reading end turns readable, and the child's watching thread wakes and ends the child. No polling,
and no platform call beyond a pipe.

Spawned children (`multiprocessing`'s "spawn") already have such a pipe: `parent_process().sentinel`. A
forkserver's workers do not (theirs is ready at once), so `lifeline` makes one per process, which a pool
hands its workers.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

# This process's lifeline: the reading end workers receive, and the writing end only this process holds
# (never written to, never closed: its exit closes it). Made again in a forked child, which must not keep
# its parent's alive.
_LIFELINE: tuple[int, Connection, Connection] | None = None
_LIFELINE_LOCK = threading.Lock()


def lifeline() -> Connection:
    """The reading end of this process's lifeline, to hand to a child (it pickles for a forkserver or spawn
    child as it starts): readable once this process has ended."""
    global _LIFELINE
    with _LIFELINE_LOCK:
        if _LIFELINE is None or _LIFELINE[0] != os.getpid():
            reading, writing = multiprocessing.Pipe(duplex=False)
            _LIFELINE = (os.getpid(), reading, writing)
        return _LIFELINE[1]


def when_gone(line: Connection | int, then: Callable[[], object], name: str) -> None:
    """Run `then` in a daemon thread of this process once `line` (a lifeline, or a spawned child's
    `parent_process().sentinel`) says the process it belongs to has ended; at once if it already has."""

    def watch() -> None:
        wait([line])
        then()

    threading.Thread(target=watch, name=name, daemon=True).start()


def when_spawning_parent_gone(then: Callable[[], object], name: str) -> bool:
    """In a spawned child: run `then` once the process that spawned it has ended. Returns False where this
    process has no such parent to watch (not started by `multiprocessing`)."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return False
    when_gone(parent.sentinel, then, name)
    return True


def exit_now() -> None:
    """End this process at once (the watching thread's `then` for a worker whose results nobody will read):
    no cleanup of its own, which the process it worked for would have done."""
    os._exit(1)
