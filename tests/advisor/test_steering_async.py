"""`POST /v1/recommendations/run` with `Prefer: respond-async` (RFC 7240) answers 202 at once with the run
under way, and the run's outcome is at `GET /v1/recommendations/steering` once `under_way` is null. Without
the header a request waited the whole run (seconds to minutes), longer than many proxies wait."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor.routers import recommendations
from tests.advisor.fakes import FakeInUse
from tests.advisor.test_steering import WAIT_SLO, app_client, store  # noqa: F401 (fixtures)
from tests.conftest import api_headers

ASYNC = {"Prefer": "respond-async"}


class HeldSteering:
    """run_steering held until `release`; `finished` waits until the run is no longer under way (its outcome
    is kept for GET /steering before that: waiting for the outcome alone once read between the two)."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, client: TestClient, fail: BaseException | None = None
    ) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.calls: list[dict[str, Any]] = []
        self._flight = client.app.state.runtime.steering  # type: ignore[attr-defined]
        real_run = recommendations.run_steering

        def run(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(kwargs)
            self.entered.set()
            assert self.release.wait(60), "the test never released the run"
            if fail is not None:
                raise fail
            return real_run(*args, **kwargs)

        monkeypatch.setattr(recommendations, "run_steering", run)

    def finished(self) -> bool:
        return self._flight.wait_until_idle(60)


def test_an_async_run_answers_at_once_and_its_outcome_is_at_the_poll_address(
    app_client: TestClient,  # noqa: F811
    store: Engine,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = api_headers(store, "operator", name="ana")
    viewer = api_headers(store, "viewer")
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
    held = HeldSteering(monkeypatch, app_client)
    started = app_client.post("/v1/recommendations/run", headers=operator | ASYNC)
    # Answered while the run is still held: the request did not wait for it.
    assert started.status_code == 202, started.text
    assert not held.release.is_set()
    assert started.headers["Location"] == "/v1/recommendations/steering"
    assert started.headers["Preference-Applied"] == "respond-async"
    body = started.json()
    assert body["joined"] is False and body["poll"] == "/v1/recommendations/steering"
    assert body["under_way"]["actor"].endswith("(ana)") and body["under_way"]["source"] == "on-demand"
    assert held.entered.wait(30)
    # Its own inputs were read before the 202 (what stops a run is said then): the run was handed them.
    assert held.calls[0]["prepared"] is not None
    during = app_client.get("/v1/recommendations/steering", headers=viewer).json()
    assert during["under_way"] == body["under_way"] and during["ran"] is False
    # A second asker, either way, shares the run under way.
    again = app_client.post("/v1/recommendations/run", headers=api_headers(store, "operator") | ASYNC)
    assert again.status_code == 202 and again.json()["joined"] is True
    assert again.json()["under_way"] == body["under_way"] and len(held.calls) == 1

    held.release.set()
    assert held.finished(), "the run did not end"
    after = app_client.get("/v1/recommendations/steering", headers=viewer).json()
    assert after["under_way"] is None and after["ran"] is True and after["evaluated"] >= 5
    pending = app_client.get("/v1/recommendations", params={"state": "pending"}, headers=viewer).json()
    assert after["recommended"] == len(pending["recommendations"]) > 0
    assert len(held.calls) == 1


def test_what_stops_a_run_is_said_at_once_and_nothing_is_left_under_way(
    app_client: TestClient,  # noqa: F811
    store: Engine,  # noqa: F811
    in_use: FakeInUse,
) -> None:
    operator = api_headers(store, "operator")
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
    in_use.models = None
    refused = app_client.post("/v1/recommendations/run", headers=operator | ASYNC)
    assert refused.status_code == 409 and "calibrate" in refused.json()["detail"]
    steering = app_client.get("/v1/recommendations/steering", headers=operator).json()
    assert steering["under_way"] is None


def test_a_background_run_that_fails_says_so_at_the_poll_address(
    app_client: TestClient,  # noqa: F811
    store: Engine,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = api_headers(store, "operator")
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
    held = HeldSteering(monkeypatch, app_client, fail=RuntimeError("the ensemble ran out of memory"))
    assert app_client.post("/v1/recommendations/run", headers=operator | ASYNC).status_code == 202
    held.release.set()
    assert held.finished()
    steering = app_client.get("/v1/recommendations/steering", headers=operator).json()
    assert steering["under_way"] is None and steering["ran"] is False
    # The error's type named, as a plan's error names it.
    said = "the last steering run failed: RuntimeError: the ensemble ran out of memory"
    assert steering["why_none"] == said
    # The next run starts afresh (the failed one left nothing under way).
    again = app_client.post("/v1/recommendations/run", headers=operator | ASYNC)
    assert again.status_code == 202 and again.json()["joined"] is False
    assert held.finished()


@pytest.mark.parametrize(
    ("prefer", "asynchronous"),
    [("respond-async", True), ("wait=10, Respond-Async", True), ("respond-async; x=1", True),
     ("return=minimal", False), ("", False), (None, False)],
)  # fmt: skip
def test_the_prefer_header_is_read_as_rfc_7240_writes_it(prefer: str | None, asynchronous: bool) -> None:
    assert recommendations._prefers_async(prefer) is asynchronous
