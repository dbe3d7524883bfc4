"""The twin's pool workers and their forkserver end when the process that made the pool ends, however it
ends: `kill -9` (or the out-of-memory killer) runs none of its code, and before `twin.lifeline` its workers
lived on, each holding its copy of the models and the workload (`twin.executors.worker_pool`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from tests.process_ends import needs_pidfd, still_running, watching
from twin.lifeline import lifeline, when_gone

REPO = Path(__file__).resolve().parents[2]


def nothing() -> None:
    pass


def where_am_i(_: Any) -> tuple[int, int]:
    """In a worker: its process id and its parent's (the forkserver)."""
    return os.getpid(), os.getppid()


def busy_forever(_: Any) -> None:
    threading.Event().wait()


POOL_OWNER = """
import json, time
from twin.executors import worker_pool
from tests.twin.test_lifeline import busy_forever, nothing, where_am_i

pool = worker_pool(2, nothing, ())
seen = set(pool.map(where_am_i, range(20)))
pool.submit(busy_forever, None)  # one worker is mid-task when its owner dies
pool.submit(busy_forever, None)
print(json.dumps(sorted(seen)), flush=True)
time.sleep(3600)
"""


@needs_pidfd
def test_a_pools_workers_and_their_forkserver_end_when_its_owner_is_killed() -> None:
    owner = subprocess.Popen([sys.executable, "-c", POOL_OWNER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        seen = json.loads(owner.stdout.readline())
        workers = {pid for pid, _ in seen}
        forkservers = {parent for _, parent in seen}
        assert len(forkservers) == 1 and owner.pid not in workers | forkservers
        with watching(workers | forkservers) as handles:
            owner.kill()
            owner.wait()
            assert still_running(handles, 30) == [], "processes of the pool outlived the process that made it"
    finally:
        owner.kill()
        owner.wait()


def test_a_lifeline_says_nothing_while_its_process_runs() -> None:
    """In the process that holds its writer, a lifeline never turns readable: a watcher would end a worker
    whose owner is alive."""
    called = threading.Event()
    when_gone(lifeline(), called.set, "test-watch")
    assert not lifeline().poll(0.2) and not called.is_set()
    assert lifeline() is lifeline()  # one per process, however many pools hand it on
