"""Bands recalibrated on the twin's own record (split conformal): hand-made scores give hand-computed
margins, the margins move the bands as stated, only intervals that ended before a forecast's start count,
and the skill keeps the ensemble's own coverage beside the shown one."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine

from tests.twin.test_skill import A100, T0, band, store_history
from tests.twin.test_skill import document as skill_document
from twin.band_calibration import (
    MIN_SCORES,
    Margin,
    calibrate_bands,
    calibrated_forecast,
    conformity,
    load_margins,
    margins_from_scores,
)
from twin.db import session_scope
from twin.forecast_store import ForecastScore, save_forecast
from twin.skill import score_due, skill


def test_conformity_is_the_distance_outside_the_band_and_negative_inside() -> None:
    assert conformity(1.0, 3.0, 4.5) == 1.5
    assert conformity(1.0, 3.0, 0.25) == 0.75
    assert conformity(1.0, 3.0, 2.5) == -0.5  # inside: minus the distance to the nearer edge


def test_the_margin_is_the_finite_sample_conformal_quantile_of_the_scores() -> None:
    # 24 intervals whose actual lay 0.01, 0.02, ..., 0.24 above a p90 of 0.4: scores 0.01 ... 0.24.
    rows = [("utilization", 0.2, 0.4, 0.4 + k / 100) for k in range(1, 25)]
    # ceil((24 + 1) * 0.8) = 20: the 20th smallest score.
    assert margins_from_scores(rows)["utilization"] == Margin(pytest.approx(0.20), 24)  # type: ignore[arg-type]
    # Inside the band the scores are negative: a band too wide narrows.
    inside = [("queue_length", 0.0, 10.0, 5.0 + k / 10) for k in range(24)]  # scores -5.0 ... -2.7
    assert margins_from_scores(inside)["queue_length"].value == pytest.approx(-(10.0 - 6.9))
    # Too few scores: no margin (the ensemble's band stays).
    assert margins_from_scores(rows[: MIN_SCORES - 1]) == {}
    with pytest.raises(ValueError, match="level"):
        margins_from_scores(rows, level=1.0)


def test_margins_move_each_band_out_but_never_past_the_mean_zero_or_a_share_of_one() -> None:
    document = skill_document()
    margins = {
        "utilization": Margin(0.3, 40),  # 0.4-0.6 -> 0.1-0.9
        "utilization/" + A100: Margin(0.5, 40),  # -> 0 (not -0.1) to 1 (not 1.1)
        "queue_length": Margin(-1.5, 40),  # narrower than the band: 1-3 around 2 -> 2-2 (the mean)
    }
    out = calibrate_bands(document, margins)
    series = out["series"]
    assert series["utilization"]["p10"] == pytest.approx([0.1, 0.1])
    assert series["utilization"]["p90"] == pytest.approx([0.9, 0.9])
    assert series["utilization"]["raw_p10"] == [0.4, 0.4] and series["utilization"]["raw_p90"] == [0.6, 0.6]
    assert series["utilization_by_type"][A100]["p10"] == [0.0, 0.0]
    assert series["utilization_by_type"][A100]["p90"] == [1.0, 1.0]
    assert series["queue_length"]["p10"] == [2.0, 2.0] and series["queue_length"]["p90"] == [2.0, 2.0]
    # A figure without a margin keeps its band, with the raw band beside it.
    assert series["energy_kwh"]["p10"] == [0.4, 0.4] and series["energy_kwh"]["raw_p10"] == [0.4, 0.4]
    assert out["band_calibration"]["figures"] == {
        "utilization": {"margin": 0.3, "scores": 40},
        "utilization/" + A100: {"margin": 0.5, "scores": 40},
        "queue_length": {"margin": -1.5, "scores": 40},
    }


def _score(engine: Engine, figure: str, ends: datetime, p10: float, p90: float, actual: float,
           raw: tuple[float, float] | None = None, forecast_id: int = 1, index: int = 0) -> None:  # fmt: skip
    with session_scope(engine) as session:
        session.add(ForecastScore(
            forecast_id=forecast_id, cluster_id="default", figure=figure, interval_index=index,
            interval_start=ends - timedelta(hours=1), interval_end=ends, forecast_mean=(p10 + p90) / 2,
            forecast_p10=p10, forecast_p90=p90, actual=actual, inside=p10 <= actual <= p90,
            raw_p10=raw[0] if raw else None, raw_p90=raw[1] if raw else None, scored_at=ends,
        ))  # fmt: skip


def test_only_intervals_that_ended_before_the_forecast_and_inside_the_window_count(engine: Engine) -> None:
    start = T0 + timedelta(days=3)
    for k in range(MIN_SCORES):  # actual 1.0 above p90, ended before the start: margin 1.0
        _score(engine, "utilization", start - timedelta(hours=k), 0.2, 0.4, 1.4, forecast_id=k)
    # Would raise the margin, but ends after the forecast's start: the forecast could not know it.
    _score(engine, "utilization", start + timedelta(minutes=1), 0.2, 0.4, 9.4, forecast_id=99)
    # Ended before the window: too old to count.
    _score(engine, "utilization", start - timedelta(days=8), 0.2, 0.4, 9.4, forecast_id=98)
    margins = load_margins(engine, "default", start, window=timedelta(days=7))
    assert margins == {"utilization": Margin(pytest.approx(1.0), MIN_SCORES)}  # type: ignore[arg-type]
    assert load_margins(engine, "other-cluster", start) == {}


def test_margins_are_measured_on_the_ensembles_own_band_not_on_a_widened_one(engine: Engine) -> None:
    start = T0 + timedelta(days=1)
    for k in range(MIN_SCORES):
        # Shown 0.0-1.0 (recalibrated), the ensemble's own 0.4-0.6; actual 0.9: 0.3 above the raw band.
        _score(
            engine, "utilization", start - timedelta(hours=k), 0.0, 1.0, 0.9, raw=(0.4, 0.6), forecast_id=k
        )
    assert load_margins(engine, "default", start)["utilization"].value == pytest.approx(0.3)


def test_a_calibrated_forecast_is_scored_on_both_bands(engine: Engine) -> None:
    store_history(engine)
    start = T0
    for k in range(MIN_SCORES):  # a record of utilization 0.2 above the band
        _score(engine, "utilization", start - timedelta(hours=k + 1), 0.1, 0.2, 0.4, forecast_id=1000 + k)
    document = calibrated_forecast(engine, "default", skill_document(start))
    assert document["series"]["utilization"]["p10"] == pytest.approx([0.2, 0.2])  # 0.4 - 0.2
    assert document["series"]["utilization"]["p90"] == pytest.approx([0.8, 0.8])
    save_forecast(engine, document, cluster_id="default")
    score_due(engine, "default", start + timedelta(hours=3))
    utilization = skill(engine, "default", since=start)["figures"]["utilization"]
    # Actuals 0.25 and 0.5 (tests.twin.test_skill): both inside 0.2-0.8, only 0.5 inside the raw 0.4-0.6.
    assert utilization["coverage"] == 1.0 and utilization["raw_coverage"] == 0.5


def test_a_document_without_a_start_is_left_alone(engine: Engine) -> None:
    document = {"series": {"utilization": band([0.5], [0.4], [0.6])}}
    assert calibrated_forecast(engine, "default", document) == document
    assert "band_calibration" not in document


def test_the_margin_reads_only_the_newest_scores(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from twin import band_calibration

    monkeypatch.setattr(band_calibration, "MAX_SCORES", MIN_SCORES)
    start = T0 + timedelta(days=3)
    for k in range(MIN_SCORES):  # the newest: actual 0.1 above the band
        _score(engine, "utilization", start - timedelta(hours=k), 0.2, 0.4, 0.5, forecast_id=k)
    for k in range(MIN_SCORES):  # older ones, far outside: beyond the read
        _score(engine, "utilization", start - timedelta(hours=30 + k), 0.2, 0.4, 5.0, forecast_id=100 + k)
    assert load_margins(engine, "default", start)["utilization"].value == pytest.approx(0.1)


def test_the_slos_scores_take_none_of_the_margins_read(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SLO's scores (a chance against 1 or 0, `twin.skill_totals.SLO_PREFIX`) are no band of a figure:
    newer than the figures' ones, they would crowd them out of the newest MAX_SCORES read."""
    from twin import band_calibration

    monkeypatch.setattr(band_calibration, "MAX_SCORES", MIN_SCORES)
    start = T0 + timedelta(days=3)
    for k in range(MIN_SCORES):
        _score(engine, "slo/p95 wait", start - timedelta(hours=k), 0.0, 1.0, 1.0, forecast_id=k)
        _score(engine, "utilization", start - timedelta(hours=30 + k), 0.2, 0.4, 0.5, forecast_id=100 + k)
    margins = load_margins(engine, "default", start)
    assert set(margins) == {"utilization"} and margins["utilization"].value == pytest.approx(0.1)
