"""The API shares the machine with the twin's work it runs (bench/busy_latency.py measures what it buys):
its worker processes run niced, and its threads hand the interpreter over sooner; both as the settings say,
and the process is left as it was when the app stops."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse
from tests.conftest import api_app
from twin.executors import set_worker_niceness, worker_niceness, worker_pool


def _niceness() -> int:
    return os.nice(0)


def _nothing() -> None:
    return None


def test_the_apis_twin_workers_run_niced_and_its_threads_switch_sooner(
    engine: Engine, tmp_path: Path
) -> None:
    # Another test's app may be running in this process (a fixture of a wider scope): as it left them.
    before_interval, before_niceness, own = sys.getswitchinterval(), worker_niceness(), os.nice(0)
    settings = advisor_settings(tmp_path, twin_worker_nice=7, api_switch_interval_ms=0.25)
    with TestClient(api_app(settings, engine, FakeInUse(None))):
        assert sys.getswitchinterval() == 0.00025
        with worker_pool(1, _nothing, ()) as pool:
            assert pool.submit(_niceness).result(timeout=60) == min(own + 7, 19)
    assert sys.getswitchinterval() == before_interval and worker_niceness() == before_niceness
    with worker_pool(1, _nothing, ()) as pool:  # a pool after the app: as before it
        assert pool.submit(_niceness).result(timeout=60) == min(own + before_niceness, 19)


@pytest.mark.parametrize("wrong", [-1, 20])
def test_a_niceness_outside_what_the_kernel_takes_is_refused(wrong: int) -> None:
    with pytest.raises(ValueError, match="from 0 to 19"):
        set_worker_niceness(wrong)
