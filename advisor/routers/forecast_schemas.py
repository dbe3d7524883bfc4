"""What the forecast endpoints answer, as schemas: a client generated from the OpenAPI document reads typed
fields where it read `{}`, any object.

The figures' names come from the twin's own lists (`twin.run_metrics`), so a figure added there is in the
schema too. `GET /v1/forecast/skill` is validated against its schema as it is served. The forecast, its
drawing against what happened and the what-if are documented, not re-validated per request: a standing
forecast stored by an earlier version may lack a field added since, and serving it beats a 500. The tests
hold each of them to the real answers, both ways (every field documented, every required one there).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from twin.run_metrics import SERIES_FIGURES, SUMMARY_FIGURES

Number = float | None  # None: no run had a value (JSON has no NaN)


class _Strict(BaseModel):
    # A key the schema does not name fails the tests' validation: the document cannot outgrow its schema.
    model_config = ConfigDict(extra="forbid")


class ClockOut(_Strict):
    """Where the twin stands in time (`twin.clock`)."""

    source: str = Field(description="telemetry or wall: which clock `now` was read from")
    now: str = Field(description="the twin's now, RFC 3339")
    wall: str = Field(description="the wall clock, RFC 3339")
    telemetry_latest: str | None = Field(description="the newest event time believed, RFC 3339")
    telemetry_lag_s: float | None = Field(description="wall minus telemetry time, seconds")


# --- GET /v1/forecast/skill ---------------------------------------------------------------------------------


class FigureSkillOut(_Strict):
    """One figure's skill over the scored intervals (`twin.skill_totals`)."""

    mape: float | None = Field(
        description="mean absolute percentage error, over the intervals with an actual"
    )
    wape: float | None = Field(description="absolute error summed over the absolute actuals summed")
    mae: float
    bias: float = Field(description="mean of forecast minus actual")
    coverage: float = Field(description="share of the intervals whose actual lay inside the p10-p90 band")
    n: int = Field(description="intervals scored")
    raw_coverage: float = Field(description="the same, for the ensemble's own band before recalibration")
    persistence_mae: float | None = Field(description="MAE of forecasting the interval before, again")
    skill_score: float | None = Field(description="1 - MAE / persistence's MAE: above 0 the twin is better")
    persistence_n: int


class SloSkillOut(_Strict):
    """One SLO's forecasts over the scored intervals: per interval the share of the runs in which it held,
    read as the probability that it holds, against whether it held on the record (`twin.skill_totals`)."""

    n: int = Field(description="intervals scored (those with data on the record)")
    forecast_share: float = Field(
        description="the mean probability forecast: the share it was said to hold in"
    )
    held_share: float = Field(description="the share of the intervals in which it held")
    brier: float = Field(
        description="mean squared difference of probability and outcome (1 or 0): 0 is perfect"
    )
    climatology_brier: float = Field(
        description="the Brier score of always saying `held_share`, a constant chance chosen in hindsight"
    )
    persistence_brier: float | None = Field(
        description="the same for persistence: it holds, or not, as in the interval before the forecast"
    )
    brier_skill: float | None = Field(
        description="1 - Brier / persistence's over the same intervals: above 0 the twin is better"
    )
    persistence_n: int


class SkillOut(_Strict):
    since: str | None = Field(description="the window's start, RFC 3339; null: every scored interval")
    scored: int = Field(description="forecasts scored")
    intervals: int = Field(description="interval figures scored (of `figures`)")
    figures: dict[str, FigureSkillOut]
    slos: dict[str, SloSkillOut] = Field(description="per SLO the forecasts judged, by its name")
    clock: ClockOut


# --- the ensemble's figures ---------------------------------------------------------------------------------


class Spread(_Strict):
    """A figure across the ensemble's runs: the mean, and p10-p90, the interval that holds one more run with
    80 % chance (`twin.ensemble.spread`); all null when no run had a value."""

    mean: Number
    p10: Number
    p90: Number


class SeriesBand(_Strict):
    """A figure per interval across the runs. `raw_p10`/`raw_p90`: the ensemble's own band, where the band
    shown was recalibrated on the twin's scored forecasts (`band_calibration`)."""

    mean: list[Number]
    p10: list[Number]
    p90: list[Number]
    raw_p10: list[Number] | None = None
    raw_p90: list[Number] | None = None


def _figures(name: str, doc: str, figures: tuple[str, ...], kind: Any, **more: Any) -> type[BaseModel]:
    fields: dict[str, Any] = {figure: (kind, ...) for figure in figures}
    return create_model(name, __base__=_Strict, __doc__=doc, **fields, **more)


ForecastSummary = _figures(
    "ForecastSummary",
    "Each figure over the whole horizon, across the runs; `utilization_by_type` per GPU type.",
    SUMMARY_FIGURES,
    Spread,
    utilization_by_type=(dict[str, Spread], ...),
)
ForecastSeries = _figures(
    "ForecastSeries",
    "Each figure per interval (`t_s` its start, `interval_end_s` its end, seconds from the forecast's "
    "start); `slo_attainment` per SLO by name (the share of runs in which it held), `utilization_by_type` "
    "per GPU type.",
    SERIES_FIGURES,
    SeriesBand,
    t_s=(list[float], ...),
    interval_end_s=(list[float], ...),
    slo_attainment=(dict[str, SeriesBand], ...),
    utilization_by_type=(dict[str, SeriesBand], ...),
)


class SloForecast(_Strict):
    """An SLO in force (one of `max` or `min`), and how the forecast expects it to fare."""

    name: str
    metric: str
    max: float | None = None
    min: float | None = None
    gpu_model: str | None = None
    value: Spread = Field(description="the figure the SLO bounds, over the horizon")
    attainment: Spread = Field(description="the share of intervals in which it held")
    probability_met: float = Field(description="the share of runs in which it held over the horizon")


class ClusterOut(_Strict):
    nodes: int = Field(description="nodes up or draining")
    draining: int = Field(description="of which draining: they run their jobs to the end, take no new one")
    gpus_by_model: dict[str, int] = Field(description="GPUs that take new jobs, per type")


class KnownJobs(_Strict):
    total: int
    running: int
    queued: int


class BandCalibrationFigure(_Strict):
    margin: float = Field(description="how far the band was moved out (or in, below 0), relative")
    scores: int = Field(description="scored intervals the margin was estimated from")


class BandCalibration(_Strict):
    method: str
    level: float = Field(description="the coverage the recalibrated band aims at")
    window_s: float = Field(description="how far back scored intervals count")
    figures: dict[str, BandCalibrationFigure]


class ForecastRun(_Strict):
    """What a forecast started from and how it was run, and its figures."""

    generated_at: str = Field(description="when it was computed, wall clock, RFC 3339")
    start: str | None = Field(description="the twin's time it starts at, RFC 3339")
    clock: ClockOut | None = Field(description="the twin's clock it started from; null in a scenario")
    horizon_s: float | None = Field(description="null: until every known job has ended")
    interval_s: float
    runs: int
    seed: int
    policy: str
    admission: str
    optimizations: list[str]
    right_size_batches: bool
    models: str = Field(description="the models it ran with: `calibrated <version>`, or the fallback")
    cluster: ClusterOut
    known_jobs: KnownJobs
    arrivals_per_day: float
    notes: list[str]
    summary: ForecastSummary  # type: ignore[valid-type]
    series: ForecastSeries  # type: ignore[valid-type]
    slos: list[SloForecast]


# --- GET /v1/forecast, POST /v1/forecast/refresh ------------------------------------------------------------


class ForecastOut(ForecastRun):
    wall_s: float = Field(description="seconds it took to compute")
    band_calibration: BandCalibration | None = Field(
        default=None, description="how the bands were recalibrated; absent when that is off"
    )
    id: int | None = Field(default=None, description="its id in the store; absent when it was not stored")
    stored_at: str | None = Field(default=None, description="when it was stored, RFC 3339")
    age_s: float = Field(description="telemetry time since its start")
    age_wall_s: float = Field(description="wall time since it was computed or stored")


# --- GET /v1/forecast/vs-actual -----------------------------------------------------------------------------


class VsActualFigure(_Strict):
    mean: list[Number]
    p10: list[Number]
    p90: list[Number]
    actual: list[Number] = Field(description="what the store recorded; null for an interval not yet passed")


class VsActualSlo(_Strict):
    name: str
    forecast: Spread | None = Field(description="the attainment forecast over the horizon, across runs")
    actual: Number = Field(
        description="the share of the passed intervals with data in which it held; null before one"
    )
    judged: int = Field(description="passed intervals with data")


class VsActualOut(_Strict):
    forecast_id: int
    start: str
    created_at: str
    age_s: float = Field(description="telemetry time since the forecast's start")
    models: str | None = Field(description="the models that made it")
    t_s: list[float]
    interval_end_s: list[float]
    intervals_passed: int
    figures: dict[str, VsActualFigure] = Field(description="by figure; per GPU type as `utilization/<type>`")
    slos: list[VsActualSlo] = Field(description="the SLOs it judged: attainment forecast, and so far")
    clock: ClockOut


# --- POST /v1/whatif ----------------------------------------------------------------------------------------


class Difference(Spread):
    """Scenario minus baseline, run by run on paired seeds; `ci95`: the 95 % interval of the mean."""

    ci95: list[float] | None


class SloDifference(_Strict):
    name: str
    metric: str
    attainment: Difference
    probability_met: float = Field(description="scenario minus baseline")


WhatIfDifference = _figures(
    "WhatIfDifference",
    "Each summary figure's difference, and each SLO's.",
    SUMMARY_FIGURES,
    Difference,
    slos=(list[SloDifference], ...),
)


class WhatIfOut(_Strict):
    name: str
    changes: dict[str, Any] = Field(description="the scenario's changes as given, defaults left out")
    baseline: ForecastRun
    scenario: ForecastRun
    difference: WhatIfDifference  # type: ignore[valid-type]
    notes: list[str]
    wall_s: float
