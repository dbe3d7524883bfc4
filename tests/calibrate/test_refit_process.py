"""A refit runs in a child process of its own, niced, in its own process group, which the API can stop and
which does not outlive the API (`calibrate.refit_process`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from calibrate.refit import RefitScheduler
from calibrate.refit_process import REFIT_NICE, RefitFailed, RefitProcess
from calibrate.registry import ModelRegistry
from finetwin.schema import migrate
from finetwin.settings import Settings
from tests.conftest import wait_for
from tests.process_ends import needs_pidfd, still_running, watching
from twin.db import make_engine

REPO = Path(__file__).resolve().parents[2]


def where_am_i(engine: Any, **kwargs: Any) -> dict[str, Any]:
    """In the child: where it runs, and what it was given."""
    return {"pid": os.getpid(), "nice": os.nice(0), "group": os.getpgid(0),
            "store": None if engine is None else engine.url.database, "kwargs": kwargs}  # fmt: skip


def refuse(engine: Any, **kwargs: Any) -> None:
    raise ValueError(f"no rows to fit on in {kwargs['where']}")


def wait_forever(engine: Any, **kwargs: Any) -> None:
    threading.Event().wait()


def fail_when_interrupted(engine: Any, **kwargs: Any) -> None:
    """Waits, having said so in a file; interrupted, raises an error of its own from the KeyboardInterrupt, as
    numpy does when one comes mid-fit."""
    Path(kwargs["waiting"]).touch()
    try:
        threading.Event().wait()
    except KeyboardInterrupt as exc:
        raise ValueError("'T{=d:sum_gradients:}' is not a valid PEP 3118 buffer format string") from exc


def test_the_child_runs_niced_in_its_own_group_on_the_same_store(tmp_path: Path) -> None:
    store = tmp_path / "finetwin.db"
    found = RefitProcess().run(where_am_i, f"sqlite:///{store}", reason="schedule", rows=3)
    assert found["pid"] != os.getpid() and found["group"] == found["pid"]
    assert found["nice"] == min(19, os.nice(0) + REFIT_NICE)
    assert found["store"] == str(store) and found["kwargs"] == {"reason": "schedule", "rows": 3}


def test_what_the_child_raises_comes_back_with_its_traceback() -> None:
    with pytest.raises(RefitFailed, match=r"^no rows to fit on in here$") as raised:
        RefitProcess().run(refuse, None, where="here")
    assert "ValueError: no rows to fit on in here" in raised.value.child_traceback
    assert "in refuse" in raised.value.child_traceback


@pytest.fixture
def ctrl_c_ignored() -> Iterator[None]:
    """This process ignores SIGINT, as one started in the background of a script does; the processes it
    starts inherit that."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("when", ["running", "starting"])
def test_stop_ends_the_child_as_an_interruption(ctrl_c_ignored: None, when: str) -> None:
    """Also when the API was started with SIGINT ignored, which its child inherits, and when the stop comes
    while the child is still starting (before it can take a SIGINT: one sent then was lost)."""
    process = RefitProcess()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            process.run(wait_forever, None)
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what it raised is the assertion
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)  # a failure here must not hang the suite at exit
    thread.start()
    # Starting: the child exists and is still importing what it runs (a second or more).
    assert (process.started if when == "running" else process.spawned).wait(timeout=60)
    process.stop()
    thread.join(timeout=60)
    assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt), outcome
    with pytest.raises(KeyboardInterrupt):  # stopped for good: the API is stopping
        process.run(where_am_i, None)


def test_a_child_stopped_mid_fit_is_interrupted_whatever_its_libraries_raise(tmp_path: Path) -> None:
    """Stopping the API during a refit logged "refit failed" with numpy's traceback, where the refit was
    abandoned as the API stopped."""
    process = RefitProcess()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            process.run(fail_when_interrupted, None, waiting=str(tmp_path / "waiting"))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what it raised is the assertion
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: (tmp_path / "waiting").exists(), 60, "the child to run its target")
    process.stop()
    thread.join(timeout=60)
    assert not thread.is_alive() and len(outcome) == 1 and isinstance(outcome[0], KeyboardInterrupt), outcome


@needs_pidfd
@pytest.mark.parametrize("end", ["os._exit(0)", "sys.exit(0)"])
def test_the_child_ends_when_the_api_process_ends(end: str) -> None:
    """A process that starts a refit and dies at once (kill -9 of the API: `os._exit`), or whose main thread
    ends without stopping it (which made the process wait for the refit at exit): its refit does not go
    on, and the process exits."""
    script = (
        "import os, sys, threading\n"
        "from calibrate.refit_process import RefitProcess\n"
        "from tests.calibrate.test_refit_process import wait_forever\n"
        "process = RefitProcess()\n"
        "threading.Thread(target=process.run, args=(wait_forever, None), daemon=True).start()\n"
        "process.started.wait()\n"
        "print(process.pid, flush=True)\n"
        "sys.stdin.readline()\n"  # until the test has a handle on the child
        f"{end}\n"
    )
    api = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert api.stdout is not None and api.stdin is not None
    child = int(api.stdout.readline())
    with watching([child]) as handles:
        api.stdin.write("\n")
        api.stdin.flush()
        assert api.wait(timeout=60) == 0
        assert still_running(handles, 60) == [], "the refit's process outlived the process that started it"


def test_the_api_stopping_abandons_a_refit_in_its_process(
    sqlite_url: str, registry_copy: Path, sample_csv: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(sqlite_url)
    migrate(engine)
    subset = registry_copy.parent / "subset.csv"
    lines = sample_csv.read_text().splitlines(keepends=True)
    subset.write_text("".join([lines[0], *lines[1::10]]))  # other rows: the refit would fit a version
    settings = Settings(refit_benchmarks=[subset], models_dir=registry_copy)
    refits = RefitScheduler(settings, engine, scheduler=None)
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(refits.refit(reason="schedule")), daemon=True)
    with caplog.at_level("INFO", logger="calibrate.refit"):
        thread.start()
        assert refits._child is not None and refits._child.started.wait(timeout=60)
        refits.stop()
        thread.join(timeout=120)
    assert not thread.is_alive() and outcome == [None]  # abandoned: no result, no error
    assert "refit (schedule) abandoned: the API is stopping" in caplog.text
    assert ModelRegistry(registry_copy).versions() == ["v0001"]
    engine.dispose()


COMPARISON_OWNER = """
import time
from calibrate.refit import _ProcessPerTask
from tests.twin.test_lifeline import busy_forever

workers = _ProcessPerTask(warm=1)
workers.submit(busy_forever, None)  # mid-fit, as it were, when its owner dies
print(*[pid for pool in workers._pools for pid in pool._processes], flush=True)
time.sleep(3600)
"""


@needs_pidfd
def test_a_comparison_fits_process_ends_when_the_calibrating_process_is_killed() -> None:
    """`finetwin calibrate` (or a refit's process) killed with -9 mid-calibration: its comparison fit's
    process went on fitting for nobody, then waited for work forever."""
    owner = subprocess.Popen(
        [sys.executable, "-c", COMPARISON_OWNER], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        workers = [int(pid) for pid in owner.stdout.readline().split()]
        assert workers
        with watching(workers) as handles:
            owner.kill()
            owner.wait()
            assert still_running(handles, 30) == [], "the comparison's process outlived the calibration"
    finally:
        owner.kill()
        owner.wait()
