"""The SLOs the advisor steers toward: read them, or declare a new set (operator)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from advisor.auth import Principal, Role, require_role
from advisor.deps import get_runtime
from advisor.parts import ApiRuntime
from advisor.slos_in_force import SlosInForce, current_slos, declare_slos
from advisor.timestamps import UtcDatetime
from twin.clock import cluster_clock
from twin.slo_actual import slos_as_they_happened, window_problem
from twin.slo_attainment import Slo, SloFormatError, SloSet
from twin.units import parse_duration

router = APIRouter(prefix="/v1/slos", tags=["slos"])


class SlosIn(SloSet):
    """The whole new set, checked as a set (names of their own). `slos` is required: `{}` is a mistake, not a
    wish to drop every SLO (that is `{"slos": []}`)."""

    slos: list[Slo] = Field(max_length=100, description="the SLOs in force from now on; [] for none")


class SlosOut(BaseModel):
    slos: list[Slo]
    source: str
    updated_at: UtcDatetime | None
    updated_by: str | None


def _out(found: SlosInForce) -> SlosOut:
    return SlosOut(
        slos=found.slos.slos, source=found.source, updated_at=found.updated_at, updated_by=found.updated_by
    )


@router.get("", response_model=SlosOut, summary="The cluster's SLOs in force and where they come from")
def get_slos(runtime: ApiRuntime = Depends(get_runtime)) -> SlosOut:
    try:
        return _out(current_slos(runtime.engine, runtime.settings))
    except SloFormatError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None


@router.put(
    "", response_model=SlosOut, summary="Declare the cluster's SLOs (replaces the set in force; operator)"
)
def put_slos(
    body: SlosIn,
    runtime: ApiRuntime = Depends(get_runtime),
    principal: Principal = Depends(require_role(Role.OPERATOR)),
) -> SlosOut:
    slos = SloSet(slos=body.slos)
    return _out(
        declare_slos(runtime.engine, slos, cluster_id=runtime.settings.cluster_id, actor=principal.actor)
    )


class SloAsItHappened(BaseModel):
    name: str
    metric: str
    max: float | None
    min: float | None
    gpu_model: str | None
    attainment: float | None = Field(
        description="share of the intervals with data in which it held; null when none has data"
    )
    judged: int = Field(description="intervals with data")
    held: list[bool | None] = Field(description="per interval, oldest first: held, or null without data")
    values: list[float | None] = Field(description="per interval: the figure the SLO bounds")


class AttainmentOut(BaseModel):
    since: UtcDatetime
    until: UtcDatetime = Field(description="the twin's now (telemetry time)")
    interval_s: float
    slos: list[SloAsItHappened]
    clock: dict[str, Any]


@router.get(
    "/attainment",
    response_model=AttainmentOut,
    summary="How the SLOs in force were attained, as it happened: per interval of the store's record",
)
def get_attainment(
    runtime: ApiRuntime = Depends(get_runtime),
    window: str = Query(
        default="24h", max_length=32, description="how far back from the twin's now: a duration, at most 31d"
    ),
) -> dict[str, Any]:
    """Each SLO judged on what the store recorded, per interval of the forecast's width
    (`FINETWIN_FORECAST_INTERVAL_MINUTES`), by the definitions a forecast's runs are judged by
    (`twin.slo_actual`): what the forecast's attainment is to be read against."""
    try:
        window_s = parse_duration(window)
    except ValueError as exc:
        raise HTTPException(422, f"window: {exc}") from None
    settings = runtime.settings
    interval_s = settings.forecast_interval_minutes * 60.0
    problem = window_problem(window_s, interval_s)
    if problem is not None:
        raise HTTPException(422, f"window: {window!r}: {problem}")
    try:
        slos = current_slos(runtime.engine, settings).slos
    except SloFormatError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    clock = cluster_clock(runtime.engine, settings)
    record = slos_as_they_happened(runtime.engine, settings.cluster_id, slos, clock.now, window_s, interval_s)
    return record | {"clock": clock.describe()}


def check_slo_file(runtime: ApiRuntime) -> None:
    """A broken SLO file is a configuration error: say so when the API starts, not at the first request."""
    current_slos(runtime.engine, runtime.settings)
