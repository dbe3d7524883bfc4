"""The SLOs the advisor steers toward: read them, or declare a new set (operator)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, Field

from advisor.auth import Principal, Role, require_role
from advisor.deps import get_runtime
from advisor.parts import ApiRuntime
from advisor.slos_in_force import SlosInForce, current_slos, declare_slos
from advisor.timestamps import UtcDatetime
from twin.slo_attainment import Slo, SloFormatError, SloSet

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


@router.get("", response_model=SlosOut, summary="The SLOs in force and where they come from")
def get_slos(runtime: ApiRuntime = Depends(get_runtime)) -> SlosOut:
    try:
        return _out(current_slos(runtime.engine, runtime.settings))
    except SloFormatError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None


@router.put("", response_model=SlosOut, summary="Declare the SLOs (replaces the set in force; operator)")
def put_slos(
    body: SlosIn,
    runtime: ApiRuntime = Depends(get_runtime),
    principal: Principal = Depends(require_role(Role.OPERATOR)),
) -> SlosOut:
    slos = SloSet(slos=body.slos)
    return _out(declare_slos(runtime.engine, slos, actor=principal.actor))


def check_slo_file(runtime: ApiRuntime) -> None:
    """A broken SLO file is a configuration error: say so when the API starts, not at the first request."""
    current_slos(runtime.engine, runtime.settings)
