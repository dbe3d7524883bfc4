"""The shapes at the boundary of job advice: the request (one configuration plus the work it has to do) and
the answer, shared by `POST /v1/advise` and `finetwin advise`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, field_validator

from twin.domain import JobConfig, known_gpu_name


class AdviceRequest(BaseModel):
    """One fine-tuning job configuration in the benchmark's terms, plus the work it has to do.

    Numbers and flags are strict: `true` is not a GPU count, `"4"` not a number, `0` not a flag."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model_name: str = Field(min_length=1, max_length=200, examples=["llama3-8b"])
    method: Literal["full", "lora", "gptq-lora"]
    gpu_model: str = Field(min_length=1, max_length=100, examples=["NVIDIA-A100-SXM4-80GB"])
    number_gpus: StrictInt = Field(ge=1, le=4096)
    number_nodes: StrictInt = Field(default=1, ge=1, le=512)
    batch_size: StrictInt = Field(ge=1, le=1_000_000)
    tokens_per_sample: StrictInt = Field(ge=1, le=1_000_000)
    enable_roce: StrictBool = False
    fast_moe: StrictInt = Field(default=0, ge=0, le=4096, description="expert-parallel degree, 0 = off")
    fast_kernels: StrictBool = False
    time_limit_s: StrictFloat | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    dataset_tokens: StrictFloat | None = Field(
        default=None, gt=0, le=1e15, allow_inf_nan=False, description="the job's work, in tokens"
    )

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        return known_gpu_name(value)  # the one check (and "did you mean") of every GPU name

    @field_validator("model_name")
    @classmethod
    def _strip(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("the model name is empty")
        return value

    def to_job(self) -> tuple[JobConfig, float | None]:
        config = JobConfig(
            model_name=self.model_name,
            method=self.method,
            gpu_model=self.gpu_model,
            number_gpus=self.number_gpus,
            number_nodes=self.number_nodes,
            batch_size=self.batch_size,
            tokens_per_sample=self.tokens_per_sample,
            enable_roce=self.enable_roce,
            fast_moe=self.fast_moe,
            fast_kernels=self.fast_kernels,
            time_limit_s=self.time_limit_s,
        )
        return config, self.dataset_tokens


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


class ConfigOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_name: str
    method: str
    gpu_model: str
    number_gpus: int
    number_nodes: int
    batch_size: int
    tokens_per_sample: int
    enable_roce: bool
    fast_moe: int
    fast_kernels: bool
    time_limit_s: float | None

    @classmethod
    def of(cls, config: JobConfig) -> ConfigOut:
        return cls(
            model_name=config.model_name, method=config.method, gpu_model=config.gpu_model,
            number_gpus=config.number_gpus, number_nodes=config.number_nodes, batch_size=config.batch_size,
            tokens_per_sample=config.tokens_per_sample, enable_roce=config.enable_roce,
            fast_moe=config.fast_moe, fast_kernels=config.fast_kernels, time_limit_s=config.time_limit_s,
        )  # fmt: skip


class Prediction(BaseModel):
    p_valid: float | None = Field(description="probability it runs without failing at runtime")
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


class Repair(BaseModel):
    config: ConfigOut
    changes: list[ChangeOut]
    prediction: Prediction | None
    evidence: list[Evidence]


class Option(BaseModel):
    config: ConfigOut
    workers: int = Field(description="nodes")
    gpus_per_worker: int
    prediction: Prediction
    why: str
    evidence: list[Evidence]


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
