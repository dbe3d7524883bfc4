"""Every stored forecast is scored against what the store recorded: hand-made forecasts against hand-made
actuals, with errors and coverage computed by hand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine

from twin.actuals import actual_series, load_job_times
from twin.db import session_scope
from twin.forecast_store import save_forecast
from twin.skill import forecast_vs_actual, score_due, score_intervals, skill
from twin.skill_totals import Totals
from twin.slo_attainment import DEFAULT_SLOS
from twin.store import Job, Node, ObservedRun

T0 = datetime(2025, 3, 1, 0, 0, tzinfo=UTC)
A100 = "NVIDIA-A100-SXM4-80GB"


def band(mean: list[float], p10: list[float], p90: list[float]) -> dict[str, list[float]]:
    return {"mean": mean, "p10": p10, "p90": p90}


def document(start: datetime = T0) -> dict[str, object]:
    return {
        "start": start.isoformat(),
        "horizon_s": 7200.0,
        "series": {
            "t_s": [0.0, 3600.0],
            "interval_end_s": [3600.0, 7200.0],
            "utilization": band([0.5, 0.5], [0.4, 0.4], [0.6, 0.6]),
            "queue_length": band([2.0, 2.0], [1.0, 1.0], [3.0, 3.0]),
            "running_jobs": band([1.0, 1.0], [0.5, 1.0], [1.5, 2.0]),
            "jobs_completed": band([0.0, 1.0], [0.0, 0.0], [0.0, 2.0]),
            "jobs_failed": band([0.0, 0.0], [0.0, 0.0], [0.0, 0.0]),
            "energy_kwh": band([1.0, 1.0], [0.4, 0.4], [1.2, 1.2]),
            "utilization_by_type": {A100: band([0.5, 0.5], [0.4, 0.4], [0.6, 0.6])},
        },
    }


UTILIZATION_SKILL = {"mape": 0.5, "wape": 0.25 / 0.75, "mae": 0.125, "bias": 0.125, "coverage": 0.5, "n": 2}
NO_BASELINE = {"persistence_mae": None, "skill_score": None, "persistence_n": 0}


def test_a_forecast_against_actuals_gives_hand_computed_errors_and_coverage() -> None:
    actual = {"utilization": np.array([0.25, 0.5]), "queue_length": np.array([4.0, 2.0])}
    scores = score_intervals(document(), actual, range(2))
    by = {(s.figure, s.index): s for s in scores}
    assert set(by) == {("utilization", 0), ("utilization", 1), ("queue_length", 0), ("queue_length", 1)}
    assert by["utilization", 0].error == pytest.approx(0.25) and not by["utilization", 0].inside
    assert by["utilization", 1].error == 0.0 and by["utilization", 1].inside
    assert by["queue_length", 0].error == -2.0 and not by["queue_length", 0].inside
    totals: dict[str, Totals] = {}
    for s in scores:
        totals.setdefault(s.figure, Totals()).add_score(s.mean, s.actual, s.inside, s.raw_inside)
    # |0.5 - 0.25| / 0.25 = 1.0 and 0: MAPE 0.5; |2 - 4| / 4 = 0.5 and 0: MAPE 0.25.
    # WAPE: total |error| over total actual, 0.25 / 0.75 and 2 / 6. No recalibrated band: raw = coverage.
    assert totals["utilization"].summary() == UTILIZATION_SKILL | {"raw_coverage": 0.5} | NO_BASELINE
    assert totals["queue_length"].summary() == {
        "mape": 0.25, "wape": 2.0 / 6.0, "mae": 1.0, "bias": -1.0, "coverage": 0.5, "n": 2,
        "raw_coverage": 0.5,
    } | NO_BASELINE  # fmt: skip


def test_the_twin_is_compared_with_persistence_over_the_same_intervals() -> None:
    """Persistence forecasts what the interval before the forecast recorded, for every interval; the skill
    score is 1 - MAE(twin) / MAE(persistence) over the intervals that have a baseline."""
    actual = {"utilization": np.array([0.25, 0.5]), "queue_length": np.array([4.0, 2.0])}
    before = {"utilization": 0.75, "queue_length": 4.0}
    scores = score_intervals(document(), actual, range(2), before)
    assert {(s.figure, s.index): s.persistence for s in scores} == {
        ("utilization", 0): 0.75, ("utilization", 1): 0.75, ("queue_length", 0): 4.0, ("queue_length", 1): 4.0
    }  # fmt: skip
    totals: dict[str, Totals] = {}
    for s in scores:
        figure = totals.setdefault(s.figure, Totals())
        figure.add_score(s.mean, s.actual, s.inside, s.raw_inside, s.persistence)
    # utilization: persistence misses by 0.5 and 0.25 (MAE 0.375), the twin by 0.25 and 0 (0.125).
    utilization = totals["utilization"].summary()
    assert utilization["persistence_mae"] == pytest.approx(0.375) and utilization["persistence_n"] == 2
    assert utilization["skill_score"] == pytest.approx(1 - 0.125 / 0.375)
    # queue: persistence misses by 0 and 2, the twin by 2 and 0: no better, no worse.
    assert totals["queue_length"].summary()["skill_score"] == pytest.approx(0.0)
    # A score without a baseline (scored before there was one) weighs on neither side of the comparison.
    totals["utilization"].add_score(0.0, 1.0, False, False)
    assert totals["utilization"].summary()["skill_score"] == pytest.approx(1 - 0.125 / 0.375)
    assert totals["utilization"].summary()["mae"] == pytest.approx((0.25 + 1.0) / 3)
    # Persistence without error: no score (a ratio over 0), not an infinitely bad twin.
    exact = Totals()
    exact.add_score(1.0, 2.0, False, False, persistence=2.0)
    assert exact.summary()["skill_score"] is None and exact.summary()["persistence_mae"] == 0.0


def store_history(engine: Engine) -> None:
    """One 8-GPU node. A: queued 0-30 min, runs 30-90 min on 4 GPUs at a measured 250 W, completes.
    B: queued 45-60 min, runs from 60 min on 2 GPUs at 100 W (still running). C: rejected at once."""
    m = timedelta(minutes=1)
    config = {"model_name": "llama3-8b", "method": "lora", "gpu_model": A100, "number_nodes": 1,
              "batch_size": 16, "tokens_per_sample": 1024, "updated_at": T0}  # fmt: skip
    with session_scope(engine) as session:
        session.add(Node(node_id="n0", gpu_model=A100, gpu_count=8, status="up", updated_at=T0))
        session.add(Job(job_id="A", state="completed", number_gpus=4, submitted_at=T0, started_at=T0 + 30 * m,
                        ended_at=T0 + 90 * m, **config))  # fmt: skip
        session.add(Job(job_id="B", state="running", number_gpus=2, submitted_at=T0 + 45 * m,
                        started_at=T0 + 60 * m, last_power_watts=100.0, **config))  # fmt: skip
        session.add(Job(job_id="C", state="rejected", number_gpus=3, submitted_at=T0 + 10 * m,
                        ended_at=T0 + 10 * m, **config))  # fmt: skip
        session.add(Job(job_id="old", state="completed", number_gpus=8, submitted_at=T0 - 300 * m,
                        started_at=T0 - 290 * m, ended_at=T0 - 200 * m, **config))  # fmt: skip
        session.flush()
        session.add(ObservedRun(job_id="A", is_valid=1, observed_at=T0 + 90 * m, gpu_power_watts_avg=250.0))
        # In the hour before T0 (what persistence forecasts from T0 on): 8 GPUs busy for its last 30 min.
        session.add(Job(job_id="before", state="completed", number_gpus=8, submitted_at=T0 - 40 * m,
                        started_at=T0 - 30 * m, ended_at=T0 - 1 * m, **config))  # fmt: skip


def test_actuals_per_interval_from_the_store(engine: Engine) -> None:
    store_history(engine)
    times = load_job_times(engine, "default", T0, T0 + timedelta(hours=2))
    assert sorted(times.gpu_models) == [A100] * 3  # "old" ended before the window
    actual = actual_series(times, [0.0, 3600.0, 7200.0])
    expected = {
        "utilization": [4 * 1800 / (8 * 3600), (4 * 1800 + 2 * 3600) / (8 * 3600)],
        "utilization/" + A100: [0.25, 0.5],
        "queue_length": [(1800 + 900) / 3600, 0.0],
        "running_jobs": [0.5, 1.5],
        "jobs_completed": [0.0, 1.0],
        "jobs_failed": [0.0, 0.0],
        "energy_kwh": [1800 * 4 * 250 / 3.6e6, (1800 * 4 * 250 + 3600 * 2 * 100) / 3.6e6],
    }
    assert set(actual) == set(expected)
    for name, values in expected.items():
        assert actual[name].tolist() == pytest.approx(values), name


def test_stored_forecasts_are_scored_once_as_telemetry_time_passes(engine: Engine) -> None:
    store_history(engine)
    forecast_id = save_forecast(engine, document(), cluster_id="default")
    # Half-way through the second interval only the first one is scored ...
    assert score_due(engine, "default", T0 + timedelta(minutes=90)) == 7
    assert skill(engine, "default")["intervals"] == 7
    # ... then the second, and nothing twice.
    assert score_due(engine, "default", T0 + timedelta(hours=3)) == 7
    assert score_due(engine, "default", T0 + timedelta(hours=3)) == 0
    result = skill(engine, "default")
    assert result["scored"] == 1 and result["intervals"] == 14
    figures = result["figures"]
    # utilization: forecast 0.5 twice against 0.25 and 0.5.
    # No recalibrated band; persistence: the hour before T0, 8 GPUs for 29 min of 8 (29/60), against 0.25
    # and 0.5, where the twin missed by 0.25 and 0.
    baseline = 29 / 60
    utilization = figures["utilization"]
    assert {k: utilization[k] for k in UTILIZATION_SKILL} == UTILIZATION_SKILL
    assert utilization["raw_coverage"] == 0.5 and utilization["persistence_n"] == 2
    persistence_mae = (abs(baseline - 0.25) + abs(baseline - 0.5)) / 2
    assert utilization["persistence_mae"] == pytest.approx(persistence_mae)
    assert utilization["skill_score"] == pytest.approx(1 - 0.125 / persistence_mae)
    # queue: "before" waited 10 of the hour's minutes; running: it ran 29 of them; completed: 1 that hour.
    assert figures["queue_length"]["persistence_mae"] == pytest.approx((abs(10 / 60 - 0.75) + 10 / 60) / 2)
    running = (abs(baseline - 0.5) + 1.5 - baseline) / 2
    assert figures["running_jobs"]["persistence_mae"] == pytest.approx(running)
    assert figures["jobs_completed"]["persistence_mae"] == pytest.approx((1.0 + 0.0) / 2)
    # queue: 2 against 0.75 (outside 1-3) and against 0 (outside; no MAPE on a zero actual).
    assert figures["queue_length"]["coverage"] == 0.0
    assert figures["queue_length"]["mape"] == pytest.approx(1.25 / 0.75)
    # running jobs: 0.5 inside [0.5, 1.5], 1.5 inside [1, 2].
    assert figures["running_jobs"]["coverage"] == 1.0
    assert figures["jobs_completed"]["coverage"] == 1.0 and figures["jobs_completed"]["mae"] == 0.0
    # energy: 0.5 and 0.7 kWh, both inside [0.4, 1.2]; forecast 1.0: MAPE (0.5/0.5 + 0.3/0.7) / 2.
    assert figures["energy_kwh"]["coverage"] == 1.0
    assert figures["energy_kwh"]["mape"] == pytest.approx((1.0 + 0.3 / 0.7) / 2)
    assert figures["utilization/" + A100]["n"] == 2
    # A window that starts after the first interval keeps the second only.
    later = skill(engine, "default", since=T0 + timedelta(minutes=30))
    assert later["figures"]["utilization"]["n"] == 1 and later["figures"]["utilization"]["coverage"] == 1.0
    view = forecast_vs_actual(engine, "default", T0 + timedelta(minutes=90))
    assert view is not None and view["forecast_id"] == forecast_id and view["intervals_passed"] == 1
    assert view["age_s"] == 5400.0 and view["models"] is None  # the hand-made document names none
    assert view["figures"]["utilization"]["actual"] == [0.25, None]


def test_the_forecasts_slo_attainment_is_set_beside_what_happened_so_far(engine: Engine) -> None:
    """Hour 1 (T0 to +60 min): A waited 30 min and started, B had waited 15 min at its end; A's 4 GPUs for
    half of it: 25 % of the A100s. Hour 2: B started after 15 min; A and B ran: 50 %."""
    store_history(engine)
    forecast = [
        {"name": "p95 wait ≤ 30 min", "metric": "wait_p95_s", "max": 1800.0,
         "attainment": {"mean": 0.4, "p10": 0.0, "p90": 1.0}},
        {"name": "A100 busy", "metric": "utilization", "min": 0.3, "gpu_model": A100,
         "attainment": {"mean": 0.5, "p10": 0.5, "p90": 0.5}},
    ]  # fmt: skip
    save_forecast(engine, document() | {"slos": forecast}, cluster_id="default")
    before = forecast_vs_actual(engine, "default", T0 + timedelta(minutes=30))
    assert before is not None and [s["judged"] for s in before["slos"]] == [0, 0]
    assert before["slos"][0] == {"name": "p95 wait ≤ 30 min", "forecast": forecast[0]["attainment"],
                                 "actual": None, "judged": 0}  # fmt: skip
    one = forecast_vs_actual(engine, "default", T0 + timedelta(minutes=90))
    assert one is not None
    assert [(s["actual"], s["judged"]) for s in one["slos"]] == [(1.0, 1), (0.0, 1)]
    two = forecast_vs_actual(engine, "default", T0 + timedelta(hours=3))
    assert two is not None
    assert [(s["actual"], s["judged"]) for s in two["slos"]] == [(1.0, 2), (0.5, 2)]
    # A stored SLO that no longer reads as one (no bound): its forecast is said, nothing set beside it.
    unbound = [{"name": "old", "metric": "wait_p95_s", "attainment": {"mean": 1.0, "p10": 1.0, "p90": 1.0}}]
    save_forecast(engine, document() | {"slos": unbound}, cluster_id="default")
    view = forecast_vs_actual(engine, "default", T0 + timedelta(hours=3))
    assert view is not None and view["slos"] == [
        {"name": "old", "forecast": unbound[0]["attainment"], "actual": None, "judged": 0}
    ]


def with_slos(doc: dict[str, object]) -> dict[str, object]:
    """`doc` judging two SLOs, with the share of its runs in which each held per interval."""
    doc["series"]["slo_attainment"] = {  # type: ignore[index]
        "p95 wait ≤ 30 min": band([0.9, 0.5], [0.0, 0.0], [1.0, 1.0]),
        "A100 busy": band([0.2, 0.6], [0.0, 0.0], [1.0, 1.0]),
    }
    slos = [{"name": "p95 wait ≤ 30 min", "metric": "wait_p95_s", "max": 1800.0},
            {"name": "A100 busy", "metric": "utilization", "min": 0.3, "gpu_model": A100}]  # fmt: skip
    return doc | {"slos": slos}


def test_each_slos_forecast_is_scored_as_a_probability_against_whether_it_held(engine: Engine) -> None:
    """Per interval a forecast says in what share of its runs each SLO held: a probability, scored against
    whether it held on the record (1 or 0) by its Brier score, beside persistence's (as in the hour
    before). Wait: held both hours, and the hour before ("before" waited 10 min). A100 busy (>= 30 %):
    25 % then 50 %, and 29/60 the hour before."""
    store_history(engine)
    save_forecast(engine, with_slos(document()), cluster_id="default")
    score_due(engine, "default", T0 + timedelta(hours=3))
    result = skill(engine, "default")
    assert set(result["slos"]) == {"p95 wait ≤ 30 min", "A100 busy"}
    assert result["intervals"] == 14  # the figures' alone, as before
    wait = result["slos"]["p95 wait ≤ 30 min"]
    # 0.9 and 0.5 against 1 and 1: Brier (0.1² + 0.5²) / 2; persistence (1) made no error: no skill score.
    assert wait == {"n": 2, "forecast_share": pytest.approx(0.7), "held_share": 1.0,
                    "brier": pytest.approx(0.13), "climatology_brier": 0.0, "persistence_brier": 0.0,
                    "brier_skill": None, "persistence_n": 2}  # fmt: skip
    busy = result["slos"]["A100 busy"]
    # 0.2 and 0.6 against 0 and 1: (0.2² + 0.4²) / 2 = 0.1; always 50 %: 0.25; persistence 1 and 1:
    # (1 + 0) / 2.
    assert busy == {"n": 2, "forecast_share": pytest.approx(0.4), "held_share": 0.5,
                    "brier": pytest.approx(0.1), "climatology_brier": 0.25, "persistence_brier": 0.5,
                    "brier_skill": pytest.approx(0.8), "persistence_n": 2}  # fmt: skip


def four_hours(start: datetime, models: str) -> dict[str, object]:
    """`document` over 4 hourly intervals: one may have passed before half the horizon has."""
    doc = document(start)
    series = {
        name: {k: v * 2 for k, v in band.items()}
        for name, band in doc["series"].items()  # type: ignore[union-attr]
        if name not in ("t_s", "interval_end_s", "utilization_by_type")
    }
    series |= {"t_s": [0.0, 3600.0, 7200.0, 10800.0], "interval_end_s": [3600.0, 7200.0, 10800.0, 14400.0]}
    return doc | {"horizon_s": 14400.0, "series": series, "models": models}


def test_the_forecast_drawn_against_what_happened_is_the_calibrated_models_once_one_has_happened(
    engine: Engine,
) -> None:
    """A fresh installation's first forecast is made before its first calibration (the fallback's rough
    numbers): it was drawn against what happened, as the twin's, for half a horizon."""
    store_history(engine)
    first = save_forecast(engine, four_hours(T0, "fallback"), cluster_id="default")
    alone = forecast_vs_actual(engine, "default", T0 + timedelta(minutes=150))
    assert alone is not None and (alone["forecast_id"], alone["models"]) == (first, "fallback")
    calibrated = save_forecast(
        engine, four_hours(T0 + timedelta(minutes=40), "calibrated v0001"), cluster_id="default"
    )
    # At 90 min nothing of the calibrated forecast has happened (50 min of its first hour): the fallback's
    # stays, with what has happened of it.
    early = forecast_vs_actual(engine, "default", T0 + timedelta(minutes=90))
    assert early is not None and early["forecast_id"] == first and early["intervals_passed"] == 1
    # At 150 min its first hour has passed, before half its horizon (2 h), where the fallback's has had
    # half of its own: the calibrated one is drawn.
    view = forecast_vs_actual(engine, "default", T0 + timedelta(minutes=150))
    assert view is not None and (view["forecast_id"], view["models"]) == (calibrated, "calibrated v0001")
    assert view["intervals_passed"] == 1 and alone["intervals_passed"] == 2


def test_skill_over_http_prometheus_and_the_cli(
    engine: Engine, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    import json

    from fastapi.testclient import TestClient

    from finetwin.cli import main
    from finetwin.settings import Settings
    from tests.conftest import api_app, api_headers

    store_history(engine)
    save_forecast(engine, with_slos(document()) | {"models": "calibrated v0007"}, cluster_id="default")
    score_due(engine, "default", T0 + timedelta(hours=3))
    expected = skill(engine, "default")
    assert set(expected["slos"]) == {"p95 wait ≤ 30 min", "A100 busy"}
    settings = Settings(data_dir=tmp_path / "data", models_dir=tmp_path / "models", scheduler_enabled=False)
    with TestClient(api_app(settings, engine)) as client:
        headers = api_headers(engine, "viewer")
        assert client.get("/v1/forecast/skill").status_code == 401
        served = client.get("/v1/forecast/skill", headers=headers).json()
        assert served["figures"] == expected["figures"] and served["scored"] == 1
        assert served["slos"] == expected["slos"]
        assert "clock" in served
        # Typed in the OpenAPI document, down to each figure's fields (it was any object).
        openapi = client.get("/openapi.json").json()
        schemas = openapi["components"]["schemas"]
        answer = openapi["paths"]["/v1/forecast/skill"]["get"]["responses"]["200"]
        assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/SkillOut"}
        figure = set(schemas["FigureSkillOut"]["properties"])
        assert figure == set(next(iter(expected["figures"].values()))), "the schema and the answer differ"
        assert set(schemas["ClockOut"]["properties"]) == set(served["clock"])
        assert set(schemas["SloSkillOut"]["properties"]) == set(expected["slos"]["A100 busy"])
        since = client.get("/v1/forecast/skill", params={"since": "2025-03-01T00:30:00Z"}, headers=headers)
        assert since.json()["figures"]["utilization"]["n"] == 1
        bad = client.get("/v1/forecast/skill", params={"since": "last tuesday"}, headers=headers)
        assert bad.status_code == 422 and "since" in bad.json()["detail"]
        # Further back than the calendar goes (an OverflowError: 500): every interval.
        ever = client.get("/v1/forecast/skill", params={"since": "99999999d"}, headers=headers)
        assert ever.status_code == 200 and ever.json()["figures"] == expected["figures"], ever.text
        # A time at the calendar's very ends (an OverflowError in UTC, or the day after it): 422, was 500.
        for edge in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59"):
            refused = client.get("/v1/forecast/skill", params={"since": edge}, headers=headers)
            assert refused.status_code == 422 and "calendar" in refused.json()["detail"], refused.text
        # RFC 3339 allows a lower-case z.
        lower = client.get("/v1/forecast/skill", params={"since": "2025-03-01T00:30:00z"}, headers=headers)
        assert lower.json()["figures"]["utilization"]["n"] == 1, lower.text
        metrics = client.get("/metrics").text
        assert 'finetwin_forecast_coverage{cluster="default",figure="utilization"} 0.5' in metrics
        wape = expected["figures"]["utilization"]["wape"]
        assert f'finetwin_forecast_wape{{cluster="default",figure="utilization"}} {wape}' in metrics
        assert 'finetwin_forecast_raw_coverage{cluster="default",figure="utilization"} 0.5' in metrics
        assert 'finetwin_forecast_scored_intervals{cluster="default",figure="queue_length"} 2.0' in metrics
        score = expected["figures"]["utilization"]["skill_score"]
        assert f'finetwin_forecast_skill_score{{cluster="default",figure="utilization"}} {score}' in metrics
        busy = expected["slos"]["A100 busy"]
        busy_slo, wait_slo = 'cluster="default",slo="A100 busy"', 'cluster="default",slo="p95 wait ≤ 30 min"'
        assert f"finetwin_forecast_slo_brier{{{busy_slo}}} {busy['brier']}" in metrics
        assert f"finetwin_forecast_slo_brier_skill{{{busy_slo}}} {busy['brier_skill']}" in metrics
        assert f"finetwin_forecast_slo_held_share{{{wait_slo}}} 1.0" in metrics
        assert f"finetwin_forecast_slo_brier_skill{{{wait_slo}}}" not in metrics  # none: no error
        view = client.get("/v1/forecast/vs-actual", headers=headers).json()
        assert view["models"] == "calibrated v0007"  # which models made the forecast drawn
        assert view["intervals_passed"] == 2 and view["figures"]["utilization"]["actual"] == [0.25, 0.5]
    monkeypatch.setenv("FINETWIN_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    assert main(["forecast", "--skill", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["figures"] == expected["figures"] and printed["slos"] == expected["slos"]
    # Beside it, the SLOs in force on the record of the last day: the twin's clock is the wall's (no
    # telemetry event), and the record's jobs are of 2025: none waited or ended in the window; B, running
    # since, holds 2 of the node's 8 GPUs in each of its 24 hours.
    record = printed["slos_as_they_happened"]
    names = [s.name for s in DEFAULT_SLOS.slos]
    assert [(s["name"], s["judged"]) for s in record["slos"]] == list(zip(names, [0, 0, 24], strict=True))
    assert record["slos"][2]["values"] == [0.25] * 24 and record["interval_s"] == 3600.0
    assert main(["forecast", "--skill", "--json", "--since", "99999999d"]) == 0  # was a traceback
    assert json.loads(capsys.readouterr().out)["figures"] == expected["figures"]
    # A time that names no zone is UTC.
    assert main(["forecast", "--skill", "--since", "2025-03-01T00:30:00", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["figures"]["utilization"]["n"] == 1
    # A window after every scored interval is what is empty, not the record (it said "scored yet").
    assert main(["forecast", "--skill", "--since", "2030-01-01T00:00:00"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no interval of cluster 'default' scored since 2030-01-01T00:00:00+00:00" in out, out
    assert main(["forecast", "--skill", "--since", "last tuesday"]) == 2
    assert "--since: not a time or a duration: 'last tuesday'" in capsys.readouterr().err
    assert main(["forecast", "--skill", "--since", "9999-12-31T23:59:59"]) == 2  # was a traceback
    assert "--since: '9999-12-31T23:59:59' is at the calendar's end" in capsys.readouterr().err
    assert main(["backtest", "--from-store", "--at", "0001-01-01T00:00:00+01:00", "--horizon", "1h"]) == 2
    assert "--at: '0001-01-01T00:00:00+01:00' is at the calendar's end" in capsys.readouterr().err
    assert main(["forecast", "--skill"]) == 0
    table = capsys.readouterr().out
    assert "utilization" in table and "50.0%" in table
    assert (
        "SLOs as they happened, the last 24 h of telemetry: p95 wait ≤ 30 min: no data; runtime failures "
        "≤ 10 %: no data; utilization ≥ 70 %: met in 0 of 24 intervals (0 %)"
    ) in " ".join(table.split()), table
    # Beside MAPE, the weighted error, which stays readable where actuals are near 0.
    utilization_row = next(line.split() for line in table.splitlines() if line.startswith("utilization"))
    wape = expected["figures"]["utilization"]["wape"]
    assert utilization_row[2] == f"{100 * wape:.1f}%" and "WAPE" in table
    # And against persistence: its MAE and the skill score, the last two columns.
    stats = expected["figures"]["utilization"]
    assert utilization_row[-2:] == [f"{stats['persistence_mae']:.3g}", f"{stats['skill_score']:+.2f}"]
    # Each SLO's forecasts: the share forecast to hold, the share held, Brier, always the share held's,
    # persistence's, the skill.
    busy_row = next(line.split() for line in table.splitlines() if line.startswith("A100 busy"))
    assert busy_row[2:] == ["2", "40.0%", "50.0%", "0.100", "0.250", "0.500", "+0.80"], busy_row


def test_forecast_skill_on_an_empty_store_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from finetwin.cli import main

    store = tmp_path / "empty.db"
    monkeypatch.setenv("FINETWIN_DATABASE_URL", f"sqlite:///{store}")
    assert main(["forecast", "--skill"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "no forecast of cluster 'default' scored yet in" in out and str(store) in out.replace(" ", "")


def reference_skill(engine: Engine, since: datetime | None) -> dict[str, dict[str, float | int | None]]:
    """The skill computed as it was before the running sums: every score of the window read, and each
    figure's statistics taken over its scores with numpy."""
    from sqlmodel import Session, col, select

    from twin.forecast_store import ForecastScore

    with Session(engine) as session:
        query = select(ForecastScore)
        if since is not None:
            query = query.where(col(ForecastScore.interval_start) >= since)
        rows = list(session.exec(query))
    figures: dict[str, dict[str, float | int | None]] = {}
    for figure in sorted({r.figure for r in rows}):
        mine = [r for r in rows if r.figure == figure]
        mean = np.array([r.forecast_mean for r in mine])
        actual = np.array([r.actual for r in mine])
        error, nonzero = mean - actual, np.abs(actual) > 1e-9
        paired = np.array([r.persistence is not None for r in mine])
        baseline = np.array([r.persistence if r.persistence is not None else np.nan for r in mine])
        if figure.startswith("slo/"):  # probabilities against outcomes: Brier scores
            squared = (baseline[paired] - actual[paired]) ** 2
            figures[figure] = {
                "n": len(mine), "forecast_share": float(mean.mean()), "held_share": float(actual.mean()),
                "brier": float(np.mean(error**2)),
                "climatology_brier": float(np.mean((actual - actual.mean()) ** 2)),
                "persistence_brier": float(squared.mean()) if paired.any() else None,
                "brier_skill": float(1 - (error[paired] ** 2).sum() / squared.sum())
                if paired.any() and squared.sum() > 1e-9 else None,
                "persistence_n": int(paired.sum()),
            }  # fmt: skip
            continue
        low = np.array([r.forecast_p10 if r.raw_p10 is None else r.raw_p10 for r in mine])
        high = np.array([r.forecast_p90 if r.raw_p90 is None else r.raw_p90 for r in mine])
        figures[figure] = {
            "mape": float(np.mean(np.abs(error[nonzero]) / np.abs(actual[nonzero])))
            if nonzero.any()
            else None,
            "wape": float(np.abs(error).sum() / np.abs(actual).sum())
            if np.abs(actual).sum() > 1e-9
            else None,
            "mae": float(np.mean(np.abs(error))),
            "bias": float(np.mean(error)),
            "coverage": float(np.mean([r.inside for r in mine])),
            "n": len(mine),
            "raw_coverage": float(np.mean((low - 1e-9 <= actual) & (actual <= high + 1e-9))),
        }
        baseline_error = np.abs(baseline[paired] - actual[paired])
        figures[figure] |= {
            "persistence_mae": float(baseline_error.mean()) if paired.any() else None,
            "skill_score": float(1 - np.abs(error[paired]).sum() / baseline_error.sum())
            if paired.any() and baseline_error.sum() > 1e-9
            else None,
            "persistence_n": int(paired.sum()),
        }
    return figures


def assert_same_skill(got: dict, expected: dict, figure: str) -> None:
    """Equal to rounding, where a figure of the skill is a number; equal where it is None."""
    assert got.keys() == expected.keys(), figure
    for name, value in expected.items():
        if value is None:
            assert got[name] is None, (figure, name)
        else:
            assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-15), (figure, name)


def random_scores(engine: Engine, forecasts: int, *, with_sums: bool = True) -> None:
    """Forecasts every 5 hours over about four days, each scored over 12 hourly intervals in two rounds (as
    telemetry time passes), actuals of 0 among them and recalibrated bands on half the intervals; with
    their running sums, as `score_due` writes them (or without: a store from before the sums)."""
    from twin import skill_totals
    from twin.forecast_store import ForecastScore

    table = ForecastScore.__table__  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    for round_ in range(2):
        with session_scope(engine) as session:
            for f in range(forecasts):
                start = T0 + timedelta(hours=5 * f, minutes=7)
                scored, rows = [], []
                for i in range(6 * round_, 6 * round_ + 6):
                    # An SLO's: the share of runs in which it held against 1 or 0 (scored from 0013 on).
                    for figure in ("utilization", "queue_length", "slo/wait")[: 3 if with_sums else 2]:
                        binary = figure.startswith("slo/")
                        mean = float(rng.random())
                        actual = float(rng.integers(0, 2) if binary else rng.choice([0.0, rng.random()]))
                        p10, p90 = mean - 0.3, mean + 0.3
                        raw = (mean - 0.2, mean + 0.2) if i % 2 else (None, None)
                        # A third without a baseline, as scores written before there was one.
                        persistence = float(rng.integers(0, 2) if binary else rng.random()) if i % 3 else None
                        row = dict(
                            forecast_id=f + 1, cluster_id="default", figure=figure, interval_index=i,
                            interval_start=start + timedelta(hours=i),
                            interval_end=start + timedelta(hours=i + 1),
                            forecast_mean=mean, forecast_p10=p10, forecast_p90=p90, actual=actual,
                            inside=p10 <= actual <= p90, raw_p10=raw[0], raw_p90=raw[1], scored_at=start,
                        )  # fmt: skip
                        if with_sums:  # a store of today's schema; else one of 0007's, without baselines
                            row["persistence"] = persistence
                        else:
                            persistence = None
                        rows.append(row)
                        low, high = (p10, p90) if raw[0] is None else raw
                        scored.append(skill_totals.Scored(
                            figure, row["interval_start"], mean, actual, row["inside"], low <= actual <= high,
                            persistence,
                        ))  # fmt: skip
                # In one statement per forecast: a statement per row took most of a test's 4-5 s.
                session.execute(table.insert(), rows)
                if with_sums:
                    skill_totals.record(session, "default", f + 1, scored)


@pytest.mark.parametrize(
    "since",
    [
        None,
        T0 - timedelta(days=3),  # before every score
        T0 + timedelta(days=1),  # a midnight: whole days only
        T0 + timedelta(days=1, hours=13, minutes=7),  # inside a day, on an interval's start
        T0 + timedelta(days=2, hours=5, minutes=30),  # inside a day, between intervals
        T0 + timedelta(days=30),  # after every score
    ],
)
def test_the_skill_from_running_sums_is_the_skill_of_every_score(
    engine: Engine, since: datetime | None
) -> None:
    """Summed per figure and day as they are written (`twin.skill_totals`), the scores give the skill that
    reading every one of them gave, for a window that starts anywhere."""
    random_scores(engine, forecasts=18)
    result = skill(engine, "default", since=since)
    expected = reference_skill(engine, since)
    assert set(result["figures"]) | {"slo/" + name for name in result["slos"]} == set(expected)
    for figure, stats in expected.items():
        got = result["slos"][figure[4:]] if figure.startswith("slo/") else result["figures"][figure]
        assert_same_skill(got, stats, figure)
    figures_n = [stats["n"] for figure, stats in expected.items() if not figure.startswith("slo/")]
    assert result["intervals"] == sum(figures_n)  # type: ignore[arg-type]
    windows = {(f, i) for f in range(18) for i in range(12) if since is None
               or T0 + timedelta(hours=5 * f + i, minutes=7) >= since}  # fmt: skip
    assert result["scored"] == len({f for f, _ in windows})
    if since is None:  # the SLO's scores are not among the figures' intervals
        assert result["scored"] == 18 and result["intervals"] == 18 * 12 * 2
        assert result["slos"]["wait"]["n"] == 18 * 12


def test_the_migration_sums_the_scores_already_stored(database_url: str) -> None:
    """A store scored before the running sums existed: migrating it gives every window the same skill."""
    from finetwin.schema import migrate
    from twin.db import make_engine

    engine = make_engine(database_url)
    migrate(engine, "0007")
    random_scores(engine, forecasts=9, with_sums=False)
    migrate(engine)
    for since in (None, T0 + timedelta(days=1, hours=2)):
        result = skill(engine, "default", since=since)
        for figure, stats in reference_skill(engine, since).items():
            assert_same_skill(result["figures"][figure], stats, figure)
            assert stats["persistence_n"] == 0 and stats["skill_score"] is None  # nothing to compare with
    assert skill(engine, "default")["scored"] == 9
    engine.dispose()


def test_an_slos_figure_fits_the_column_and_two_long_names_stay_apart() -> None:
    from twin.forecast_store import FIGURE_MAX_LENGTH
    from twin.skill_totals import slo_figure

    assert slo_figure("p95 wait ≤ 30 min") == "slo/p95 wait ≤ 30 min"
    assert len(slo_figure("x" * (FIGURE_MAX_LENGTH - 4))) == FIGURE_MAX_LENGTH  # just fits
    first, second = slo_figure("x" * 199 + "a"), slo_figure("x" * 199 + "b")  # SLO names go to 200
    assert first != second and max(len(first), len(second)) <= FIGURE_MAX_LENGTH
    assert first.startswith("slo/" + "x" * 100)
