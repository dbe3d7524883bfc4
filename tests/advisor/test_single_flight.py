"""One steering run at a time: whoever asks while one is under way gets its outcome (advisor.single_flight).
Two operators pressing "run steering now" at once ran it twice, each at half speed, to the same answer."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from advisor.routers import recommendations
from advisor.single_flight import SingleFlight
from tests.advisor.test_steering import WAIT_SLO, app_client, store  # noqa: F401 (fixtures)
from tests.conftest import api_headers


def test_a_caller_during_a_run_gets_that_runs_outcome_and_the_next_runs_again() -> None:
    flight: SingleFlight[int] = SingleFlight()
    runs: list[int] = []

    def job() -> int:
        runs.append(1)
        assert flight.wait_for_callers(2, 30), "the second caller did not join"
        return len(runs)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(flight.run, job)
        assert flight.wait_for_callers(1, 30)
        second = pool.submit(flight.run, job)
        outcomes = [first.result(30), second.result(30)]
    assert [(o.value, o.joined) for o in outcomes] == [(1, False), (1, True)]
    assert runs == [1]
    runs.clear()
    assert flight.run(lambda: 7).joined is False and flight.callers == 0


def test_a_background_run_is_awaited_until_nothing_is_under_way() -> None:
    """A run's job keeps its outcome before the run ends; a poller that saw the outcome could still see it
    under way (CI once read between the two). `wait_until_idle` returns once `under_way` says None."""
    flight: SingleFlight[int] = SingleFlight()
    release, kept, seen = threading.Event(), threading.Event(), threading.Event()

    def job() -> int:
        assert release.wait(30)
        kept.set()  # the job's own bookkeeping (its outcome kept), done while the run is still under way
        assert seen.wait(30)
        return 1

    about, joined = flight.start(job, {"actor": "ana"})
    assert (about, joined) == ({"actor": "ana"}, False)
    release.set()
    assert kept.wait(30)
    # The window a poller can read: the outcome is kept, the run is still under way.
    assert flight.under_way() == {"actor": "ana"} and flight.wait_until_idle(0.05) is False
    seen.set()
    assert flight.wait_until_idle(30) is True
    assert flight.under_way() is None


def test_the_runs_error_reaches_every_caller() -> None:
    flight: SingleFlight[int] = SingleFlight()
    started = threading.Event()

    def failing() -> int:
        started.set()
        assert flight.wait_for_callers(2, 30)
        raise RuntimeError("no model in use")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(flight.run, failing)
        started.wait(30)
        second = pool.submit(flight.run, failing)
        for future in (first, second):
            with pytest.raises(RuntimeError, match="no model in use"):
                future.result(30)


def test_two_operators_running_steering_at_once_share_one_run(
    app_client: TestClient,  # noqa: F811
    store: Engine,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator = api_headers(store, "operator")
    assert app_client.put("/v1/slos", json=WAIT_SLO, headers=operator).status_code == 200
    runtime = app_client.app.state.runtime  # type: ignore[attr-defined]
    actors: list[str] = []
    real = recommendations.run_steering

    def steering_once_both_ask(*args: Any, **kwargs: Any) -> Any:
        actors.append(kwargs["actor"])
        assert runtime.steering.wait_for_callers(2, 60), "the second request did not join the run"
        return real(*args, **kwargs)

    monkeypatch.setattr(recommendations, "run_steering", steering_once_both_ask)
    headers = [api_headers(store, "operator", name=name) for name in ("ana", "ben")]
    with ThreadPoolExecutor(2) as pool:
        responses = list(pool.map(lambda h: app_client.post("/v1/recommendations/run", headers=h), headers))
    assert [r.status_code for r in responses] == [200, 200], [r.text for r in responses]
    assert len(actors) == 1
    first, second = (r.json() for r in responses)
    joined = ["already under way" in " ".join(body["notes"]) for body in (first, second)]
    assert sorted(joined) == [False, True]
    assert first["recommendations"] == second["recommendations"] and first["evaluated"] == second["evaluated"]
