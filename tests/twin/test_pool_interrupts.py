"""A terminal's Ctrl-C reaches every process of its foreground group, the twin's pool workers included. They
leave it to their parent (`twin.executors.start_forkserver`): a Ctrl-C that reaches a worker neither
interrupts the run it is computing nor breaks its pool. Without that, `finetwin up` stopped with a worker's
KeyboardInterrupt traceback and "standing forecast refresh failed ... BrokenPipeError"."""

from __future__ import annotations

import importlib
import os
import signal
from collections.abc import Iterator
from multiprocessing import forkserver, get_context
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import twin.forkserver_preload
from tests.twin.conftest import one_node
from tests.twin.test_correlated import CorrelatedModels, one_family_workload
from twin.ensemble import EnsembleSpec, run_ensemble
from twin.executors import LocalExecutor, start_forkserver
from twin.plan import prepare_catalog
from twin.slo_attainment import SloSet


@pytest.fixture
def fresh_forkserver(ctrl_c_raises: None) -> Iterator[None]:
    """The forkserver started anew, from this process taking Ctrl-C as a terminal's does: one started
    earlier in the run may have inherited Ctrl-C ignored, and so would its workers, fix or no fix."""
    server = forkserver._forkserver  # type: ignore[attr-defined]
    server._stop()  # what CPython's own tests use to stop it
    try:
        yield
    finally:
        server._stop()  # the next pool starts one again


def _interrupted_then_doubled(_shared: Any, task: int) -> int:
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C to this worker
    return task * 2


def test_a_ctrl_c_to_a_pool_worker_neither_stops_its_task_nor_breaks_the_pool(fresh_forkserver: None) -> None:
    try:
        results = LocalExecutor(2, retries=0).run(_interrupted_then_doubled, None, [1, 2, 3, 4])
    except KeyboardInterrupt:  # a task's KeyboardInterrupt comes back as its result's exception
        pytest.fail("a worker's Ctrl-C interrupted its task")
    assert results == [2, 4, 6, 8]


def _report_ctrl_c_handler(connection: Connection) -> None:
    connection.send(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_the_forkservers_processes_are_born_ignoring_ctrl_c(fresh_forkserver: None) -> None:
    """Before any code of theirs runs (no initializer here): a Ctrl-C while a worker starts is not raised."""
    start_forkserver()
    receiver, sender = get_context("forkserver").Pipe(duplex=False)
    child = get_context("forkserver").Process(target=_report_ctrl_c_handler, args=(sender,))
    child.start()
    assert receiver.recv() is True
    child.join()
    assert child.exitcode == 0


def test_importing_the_preload_elsewhere_leaves_ctrl_c_alone(ctrl_c_raises: None) -> None:
    importlib.reload(twin.forkserver_preload)
    assert not twin.forkserver_preload.in_the_forkserver()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _forkserver_children() -> list[int]:
    """The processes the forkserver forked: the pool workers of this test."""
    server = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    children = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while it was listed
            continue
        if int(fields[1]) == server:  # the field after the state is the parent's id
            children.append(int(status.parent.name))
    return children


def test_an_ensemble_hit_by_ctrl_c_mid_way_finishes_with_the_same_runs(fresh_forkserver: None) -> None:
    workload = one_family_workload(40)
    catalog = prepare_catalog(workload.catalog, CorrelatedModels(0.5))
    spec = EnsembleSpec(cluster=one_node(), workload=workload, catalog=catalog, slos=SloSet(slos=[]))
    interrupted: list[int] = []

    def interrupt_the_workers() -> None:  # the parent's view of each finished run
        if not interrupted:
            interrupted.extend(_forkserver_children())
            for pid in interrupted:
                os.kill(pid, signal.SIGINT)

    try:
        pooled = run_ensemble(spec, 8, workers=2, progress=interrupt_the_workers)
    except KeyboardInterrupt:
        pytest.fail("a worker's Ctrl-C interrupted its run")
    assert interrupted  # the workers were there, and were sent Ctrl-C
    alone = run_ensemble(spec, 8, workers=1)
    assert [o.summary for o in pooled] == [o.summary for o in alone]
