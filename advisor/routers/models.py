"""Calibrated models over HTTP: predictions for configurations, the registry's versions, and the live error.

The hourly refit and the drift check run on the app's scheduler (`calibrate.refit`, installed by the
lifespan of `advisor.app`).
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from sqlalchemy import Engine

from advisor.auth import Role, access
from advisor.deps import get_engine, get_models_in_use, get_settings
from advisor.parts import ModelsInUse
from advisor.settings import AdvisorSettings
from advisor.timestamps import UtcDatetime
from calibrate.config_frame import configs_to_frame
from calibrate.drift import DriftPolicy, drift, live_error_series, summarize
from calibrate.registry import ModelRegistry, RegistryError
from twin.domain import known_gpu_name
from twin.job_config import DescribedJobConfig, method_in_any_case, not_blank
from twin.jsonsafe import finite_or_none

router = APIRouter(tags=["models"])

MAX_BATCH = 10_000
NO_MODEL = 409  # a client error the caller can resolve (calibrate a model), never a 5xx


class ConfigIn(DescribedJobConfig):
    """One fine-tuning configuration in the benchmark's terms (the configuration columns of a row)."""

    strip_model_name = field_validator("model_name")(not_blank)
    lower_method = field_validator("method", mode="before")(method_in_any_case)

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        # As `finetwin predict` and `/v1/advise` refuse it: a name the catalogue lacks (`A100`, `A100-SMX`)
        # was predicted as an A100-PCIe, with only a note to say so.
        return known_gpu_name(value)


class PredictRequest(BaseModel):
    """`{"configs": [...]}`; a single configuration object or a bare list of them is accepted too."""

    model_config = ConfigDict(extra="forbid")

    configs: list[ConfigIn] = Field(min_length=1, max_length=MAX_BATCH)

    @model_validator(mode="before")
    @classmethod
    def _one_or_many(cls, data: Any) -> Any:
        if isinstance(data, list):
            return {"configs": data}
        if isinstance(data, dict) and "configs" not in data:
            return {"configs": [data]}
        return data


class PredictionOut(BaseModel):
    outcome: Literal["valid", "rejected", "runtime"]
    rule: str | None
    p_valid: float
    tokens_per_second_p10: float | None
    tokens_per_second_p50: float | None
    tokens_per_second_p90: float | None
    note: str | None


class PredictResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_version: str
    predictions: list[PredictionOut]


class ModelVersionOut(BaseModel):
    version: str
    in_use: bool
    created_at: str | None = None
    reason: str | None = None
    rows: int | None = None
    rows_by_source: dict[str, int] = {}
    heldout_metrics: dict[str, float | None] = {}
    promoted_at_fit: bool | None = None
    compared_with: str | None = None
    comparison_basis: str | None = None
    fit_seconds: float | None = None
    error: str | None = None  # metadata that cannot be read


class ModelsOut(BaseModel):
    in_use: str | None
    # How this process runs the loaded version's trees: "native" (compiled for this machine), "compiling"
    # (in the background; answers meanwhile come from the tree walker, about half as fast), "walker" (a
    # compile failed), "treelite" (no C compiler, or native trees off); null before a version is loaded.
    trees: str | None = None
    versions: list[ModelVersionOut]
    history: list[dict[str, Any]]


class LiveErrorPointOut(BaseModel):
    job_id: str
    ended_at: UtcDatetime
    model_version: str
    predicted_outcome: str
    actual_outcome: str
    ape: float | None
    rolling_jobs: int
    rolling_mdape: float | None
    rolling_failure_error: float | None


class LiveErrorNow(BaseModel):
    model_version: str
    jobs: int
    throughput_jobs: int
    mdape: float | None
    band_coverage: float | None
    failure_error: float | None
    drifting: bool
    reasons: list[str]


class LiveErrorOut(BaseModel):
    window: int
    min_jobs: int
    mdape_threshold: float
    failure_error_threshold: float
    in_use: str | None
    current: LiveErrorNow | None  # the version in use, over its own last `window` finished jobs
    points: list[LiveErrorPointOut]


@router.post(
    "/v1/predict",
    response_model=PredictResponse,
    summary="Predict outcome, p_valid and throughput band for one configuration or a batch",
    responses={409: {"description": "no calibrated model is in use (or it failed verification)"}},
    openapi_extra=access(Role.VIEWER),  # computes only, changes nothing
)
def predict(body: PredictRequest, cache: ModelsInUse = Depends(get_models_in_use)) -> PredictResponse:
    try:
        loaded = cache.get()
    except RegistryError as exc:
        raise HTTPException(
            status_code=NO_MODEL, detail=f"the model in use cannot be loaded: {exc}"
        ) from None
    if loaded is None:
        raise HTTPException(
            status_code=NO_MODEL,
            detail="no calibrated model is in use; run `finetwin calibrate --bench FILE` first",
        )
    version, models = loaded
    predicted = models.predict_frame(configs_to_frame([c.to_config() for c in body.configs]))
    return PredictResponse(
        model_version=version,
        predictions=[
            PredictionOut(
                outcome=p.outcome,
                rule=p.rule if isinstance(p.rule, str) and p.rule else None,
                p_valid=float(p.p_valid),
                tokens_per_second_p10=finite_or_none(p.tokens_per_second_p10),
                tokens_per_second_p50=finite_or_none(p.tokens_per_second_p50),
                tokens_per_second_p90=finite_or_none(p.tokens_per_second_p90),
                note=p.note if isinstance(p.note, str) and p.note else None,
            )
            for p in predicted.itertuples(index=False)
        ],
    )


@router.get("/v1/models", response_model=ModelsOut, summary="Model versions, the one in use, and the history")
def list_models(
    settings: AdvisorSettings = Depends(get_settings), cache: ModelsInUse = Depends(get_models_in_use)
) -> ModelsOut:
    registry = ModelRegistry(settings.resolved_models_dir())
    try:
        in_use = registry.in_use()
        history = registry.history()
    except (RegistryError, ValueError) as exc:
        raise HTTPException(
            status_code=NO_MODEL, detail=f"the model registry cannot be read: {exc}"
        ) from None
    return ModelsOut(
        in_use=in_use,
        trees=cache.tree_engine(),
        versions=[_version(registry, v, v == in_use) for v in registry.versions()],
        history=history,
    )


@router.get(
    "/v1/models/live-error",
    response_model=LiveErrorOut,
    responses={404: {"description": "`model_version` names no version of the registry or the store"}},
    summary="Rolling live error (throughput MdAPE, outcome error) of the predictions, job by job",
)
def live_error(
    window: int | None = Query(default=None, ge=1, le=10_000, description="jobs per rolling window"),
    limit: int = Query(default=500, ge=1, le=10_000, description="most recent finished jobs to return"),
    model_version: str | None = Query(default=None, max_length=64, description="only this version's jobs"),
    settings: AdvisorSettings = Depends(get_settings),
    engine: Engine = Depends(get_engine),
) -> LiveErrorOut:
    policy = DriftPolicy.from_settings(settings)
    window = window or policy.window
    registry = ModelRegistry(settings.resolved_models_dir())
    try:
        in_use = registry.in_use()
    except RegistryError:
        in_use = None
    with engine.connect() as connection:
        points = live_error_series(connection, window=window, limit=limit, model_version=model_version)
        if model_version is not None and not points:
            # A misspelt version (`v1` for `v0001`) read as an empty series: as if it had no finished job.
            versions = registry.versions()
            if model_version not in versions:
                detail = f"no model version {model_version!r} (versions: {', '.join(versions) or 'none yet'})"
                raise HTTPException(status_code=404, detail=detail)
        current = None
        if in_use is not None:
            summary = summarize(connection, in_use, window)
            report = drift(summary, policy)
            current = LiveErrorNow(
                model_version=in_use, jobs=summary.jobs, throughput_jobs=summary.throughput_jobs,
                mdape=summary.mdape, band_coverage=summary.band_coverage, failure_error=summary.failure_error,
                drifting=report is not None, reasons=report.reasons if report else [],
            )  # fmt: skip
    return LiveErrorOut(
        window=window,
        min_jobs=policy.min_jobs,
        mdape_threshold=policy.mdape_threshold,
        failure_error_threshold=policy.failure_error_threshold,
        in_use=in_use,
        current=current,
        points=[LiveErrorPointOut(**vars(p)) for p in points],
    )


def _version(registry: ModelRegistry, version: str, in_use: bool) -> ModelVersionOut:
    try:
        metadata = registry.metadata(version)
    except RegistryError as exc:
        return ModelVersionOut(version=version, in_use=in_use, error=str(exc))
    data = metadata.get("data", {})
    comparison = metadata.get("comparison") or {}
    return ModelVersionOut(
        version=version,
        in_use=in_use,
        created_at=metadata.get("created_at"),
        reason=metadata.get("reason"),
        rows=data.get("n_rows"),
        rows_by_source=data.get("rows_by_source", {}),
        heldout_metrics={k: finite_or_none(v) for k, v in metadata.get("heldout_metrics", {}).items()},
        promoted_at_fit=metadata.get("promoted"),
        compared_with=comparison.get("against"),
        comparison_basis=comparison.get("basis"),
        fit_seconds=metadata.get("fit_seconds"),
    )
