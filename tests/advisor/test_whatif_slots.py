"""`POST /v1/whatif` runs at most FINETWIN_WHATIF_CONCURRENCY what-ifs at once: each forks a pool of worker
processes, and a viewer's key may ask (it only computes), so a few callers' what-ifs took every core and
gigabytes of memory from the rest of the API. The next is a 429 that says why, with Retry-After; a slot
frees when its what-if ends, however it ends."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from advisor.routers import forecast
from tests.advisor.conftest import advisor_settings
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.advisor.seed import seed_overloaded_cluster
from tests.conftest import api_app, api_headers

WHATIF = {"runs": 2, "horizon": "2h", "changes": {"policy": "backfill"}}


class HeldWhatIfs:
    """`run_whatif` replaced by one that says it started and waits to be released (or fails)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> None:
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.fail = fail
        monkeypatch.setattr(forecast, "run_whatif", self.run)

    def run(self, *_args: Any, **_kwargs: Any) -> dict[str, Any]:
        self.started.release()
        assert self.release.wait(60), "the test never released the what-if"
        if self.fail:
            raise RuntimeError("a worker died")
        return {"held": True}


def test_what_ifs_beyond_the_limit_are_refused_until_a_slot_frees(
    engine: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_overloaded_cluster(engine)
    held = HeldWhatIfs(monkeypatch)
    app = api_app(advisor_settings(tmp_path, whatif_concurrency=2), engine, FakeInUse(FakeModels()))
    viewer = api_headers(engine, "viewer")
    with TestClient(app, headers=viewer) as client:
        answers: list[Any] = []
        callers = [threading.Thread(target=lambda: answers.append(client.post("/v1/whatif", json=WHATIF)))
                   for _ in range(2)]  # fmt: skip
        for caller in callers:
            caller.start()
        for _ in callers:  # both running
            assert held.started.acquire(timeout=60)
        refused = client.post("/v1/whatif", json=WHATIF)
        assert refused.status_code == 429, refused.text
        assert refused.json()["detail"] == (
            "2 what-ifs already running here (FINETWIN_WHATIF_CONCURRENCY); retry in a few seconds"
        )
        assert refused.headers["Retry-After"] == "5"
        held.release.set()
        for caller in callers:
            caller.join(60)
        assert [a.status_code for a in answers] == [200, 200] and answers[0].json() == {"held": True}
        assert client.post("/v1/whatif", json=WHATIF).status_code == 200  # the slots are free again


def test_a_what_if_that_fails_frees_its_slot(
    engine: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_overloaded_cluster(engine)
    held = HeldWhatIfs(monkeypatch, fail=True)
    held.release.set()
    app = api_app(advisor_settings(tmp_path, whatif_concurrency=1), engine, FakeInUse(FakeModels()))
    with TestClient(app, headers=api_headers(engine, "viewer"), raise_server_exceptions=False) as client:
        assert client.post("/v1/whatif", json=WHATIF).status_code == 500
        held.fail = False
        assert client.post("/v1/whatif", json=WHATIF).status_code == 200
