"""The shapes at the boundary of job advice: the request (one configuration plus the work it has to do) and
the answer, shared by `POST /v1/advise` and `finetwin advise`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator

from twin.domain import JobConfig, known_gpu_name
from twin.job_config import DescribedJobConfig, JobConfigOut, method_in_any_case, not_blank


class AdviceRequest(DescribedJobConfig):
    """One fine-tuning job configuration in the benchmark's terms (`twin.domain.JobConfig`), with the
    benchmark's descriptors of the run where known (its protocol, which the models' protocol features read),
    plus the work it has to do. Stricter than the telemetry in what it can advise on: a GPU model of the
    catalogue, a model name that is not blank."""

    dataset_tokens: StrictFloat | None = Field(
        default=None, gt=0, le=1e15, allow_inf_nan=False, description="the job's work, in tokens"
    )

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        return known_gpu_name(value)  # the one check (and "did you mean") of every GPU name

    strip_model_name = field_validator("model_name")(not_blank)
    lower_method = field_validator("method", mode="before")(method_in_any_case)

    def to_job(self) -> tuple[JobConfig, float | None]:
        config = self.to_config()
        # As the loader reads a benchmark row: a protocol that stops after N seconds caps the run at N, and
        # the answer says the limit it assumed.
        return config.with_changes(time_limit_s=config.run_limit_s), self.dataset_tokens


class Evidence(BaseModel):
    finding: str = Field(description="which finding of the paper, e.g. F3")
    where: str = Field(description="section / figure of the paper")
    statement: str
    paper: dict[str, Any] = Field(description="the published numbers, by paper_figures.json key")
    predicted: dict[str, Any] = Field(default_factory=dict, description="what the calibrated models predict")


class Band(BaseModel):
    p10: float
    p50: float
    p90: float


class ConfigOut(JobConfigOut):  # type: ignore[misc,valid-type]
    """The configuration an answer is about (`ConfigOut.of(config)`)."""


class Prediction(BaseModel):
    p_valid: float | None = Field(description="probability it runs without failing at runtime")
    p_valid_low: float | None = Field(
        default=None,
        description="calibrated lower bound on p_valid (95 %, out-of-fold); recommendations need it high",
    )
    tokens_per_second: Band | None
    run_time_s: Band | None = Field(default=None, description="for the job's work: p10 = fastest")
    gpu_hours: float | None = None
    energy_kwh: float | None = None


class Verdict(BaseModel):
    status: Literal["valid", "rejected", "likely_oom"]
    rule: str | None = Field(default=None, description="the admission rule it breaks (status rejected)")
    p_valid: float | None
    p_oom: float | None = Field(description="probability it fails at runtime (out of memory)")
    message: str
    prediction: Prediction | None = None
    evidence: list[Evidence] = Field(default_factory=list)


class ChangeOut(BaseModel):
    field: str
    old: Any
    new: Any
    why: str


class Option(BaseModel):
    config: ConfigOut
    workers: int = Field(description="nodes")
    gpus_per_worker: int
    prediction: Prediction
    why: str
    evidence: list[Evidence]
    confidence: str = Field(
        default="", description="how sure the advisor is that it runs (from the lower bound on p_valid)"
    )
    alternative: Option | None = Field(
        default=None,
        description=(
            "the next-safest configuration: the one closest to this (GPUs, then batch) among those likely to "
            "run with at least as high a lower bound on p_valid, else the closest likely to run"
        ),
    )


class Repair(BaseModel):
    config: ConfigOut
    changes: list[ChangeOut]
    prediction: Prediction | None
    evidence: list[Evidence]
    confident: bool = Field(
        default=True,
        description="the lower bound on p_valid of the repaired job meets the advisor's threshold; when not, "
        "follow `alternative` instead",
    )
    confidence: str = ""
    alternative: Option | None = Field(
        default=None,
        description="the safest configuration close to the repair (the one to follow when not "
        "confident; otherwise the next-safest)",
    )


class Placement(BaseModel):
    number_nodes: int
    gpus_per_node: int
    single_node: bool
    message: str
    evidence: list[Evidence]


class OptimizationAdvice(BaseModel):
    name: Literal["fast_kernels", "fast_moe", "enable_roce"]
    recommended: bool
    setting: Any = Field(description="the value to use")
    predicted_speedup: float | None = Field(description="model: p50 tokens/s with it / without it")
    message: str
    evidence: list[Evidence]


class Work(BaseModel):
    dataset_tokens: float
    assumed: bool = Field(description="true when the request gave no dataset_tokens")


class AdviceOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_version: str | None
    config: ConfigOut
    work: Work
    verdict: Verdict
    repair: Repair | None
    fewest_gpus: Option | None
    best_throughput: Option | None
    best_cost: Option | None
    placement: Placement
    optimizations: list[OptimizationAdvice]
    notes: list[str]
