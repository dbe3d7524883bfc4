"""What `GET /v1/forecast/skill` answers, as a schema: a client generated from the OpenAPI document reads
typed fields (it was `{}`, any object)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ClockOut(BaseModel):
    """Where the twin stands in time (`twin.clock`)."""

    source: str = Field(description="telemetry or wall: which clock `now` was read from")
    now: str = Field(description="the twin's now, RFC 3339")
    wall: str = Field(description="the wall clock, RFC 3339")
    telemetry_latest: str | None = Field(description="the newest event time believed, RFC 3339")
    telemetry_lag_s: float | None = Field(description="wall minus telemetry time, seconds")


class FigureSkillOut(BaseModel):
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


class SkillOut(BaseModel):
    since: str | None = Field(description="the window's start, RFC 3339; null: every scored interval")
    scored: int = Field(description="forecasts scored")
    intervals: int = Field(description="interval figures scored")
    figures: dict[str, FigureSkillOut]
    clock: ClockOut
