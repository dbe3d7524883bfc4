"""Declared service level objectives and how a forecast attains them.

An SLO bounds one figure of the cluster: `max` (e.g. p95 wait ≤ 30 min, runtime-failure ratio ≤ 10 %) or
`min` (e.g. utilization ≥ 70 %, optionally of one GPU type). Declared in a YAML file
(`FINETWIN_SLO_FILE`, `slos: [{name, metric, max|min, gpu_model?}]`) or through the API; the pydantic
models here validate both.

For one run: `attainment` is the fraction of intervals in which the objective holds (intervals without
data, e.g. no job started and none waiting, do not count: `twin.run_metrics` counts the jobs still
waiting at an interval's end at their wait so far), `met` whether it holds over the whole window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from twin.domain import known_gpu_name
from twin.input_errors import validation_message
from twin.run_metrics import RunMetrics

SloMetric = Literal["wait_p95_s", "wait_p50_s", "runtime_failure_ratio", "utilization", "queue_length"]

# Figures that are shares of 1 (0.7 is 70 %).
SHARE_METRICS = frozenset({"runtime_failure_ratio", "utilization"})
# The whole-window figure that matches each per-interval series.
_SUMMARY_FIGURE = {
    "wait_p95_s": "wait_p95_s",
    "wait_p50_s": "wait_p50_s",
    "runtime_failure_ratio": "runtime_failure_ratio",
    "utilization": "utilization",
    "queue_length": "queue_length_mean",
}


class SloFormatError(ValueError):
    """An SLO file that cannot be used; says which file and what is wrong."""


class Slo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    metric: SloMetric
    max: StrictFloat | None = Field(default=None, description="the figure must stay at or below this")
    min: StrictFloat | None = Field(default=None, description="the figure must stay at or above this")
    gpu_model: str | None = Field(
        default=None, min_length=1, max_length=100, description="utilization of one GPU type only"
    )

    @field_validator("gpu_model")
    @classmethod
    def _known_gpu(cls, name: str | None, info: ValidationInfo) -> str | None:
        # As everywhere else a GPU type is named: a typo made an SLO about a type no forecast has, never met.
        # A set stored before this check is read as it was stored, so that the API still starts.
        if name is None or (info.context or {}).get(STORED):
            return name
        return known_gpu_name(name)

    @model_validator(mode="after")
    def _one_bound(self) -> Slo:
        if (self.max is None) == (self.min is None):
            raise ValueError("give exactly one of max or min")
        bound = self.max if self.max is not None else self.min
        if bound is None or not math.isfinite(bound) or bound < 0:
            raise ValueError("the bound must be a finite number ≥ 0")
        if self.metric in SHARE_METRICS and bound > 1:
            # 70 for 70 %: a utilization floor no cluster reaches, a failure ceiling no forecast breaks.
            raise ValueError(f"{self.metric} is a share from 0 to 1: write {bound / 100:g} for {bound:g} %")
        if self.gpu_model is not None and self.metric != "utilization":
            raise ValueError("gpu_model applies to the utilization metric only")
        return self

    def holds(self, value: float) -> bool:
        if self.max is not None:
            return value <= self.max
        assert self.min is not None
        return value >= self.min


class SloSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slos: list[Slo] = Field(default_factory=list, max_length=100)

    @field_validator("slos")
    @classmethod
    def _distinct_names(cls, slos: list[Slo], info: ValidationInfo) -> list[Slo]:
        # A forecast's attainment series and a plan's scenarios are keyed by name: of two SLOs of one name,
        # one disappeared from both.
        names = [slo.name for slo in slos]
        repeated = next((name for name in names if names.count(name) > 1), None)
        if repeated is not None and not (info.context or {}).get(STORED):
            raise ValueError(f"two SLOs are named {repeated!r}: each needs a name of its own")
        return slos


# Validation context for a set read back from the store: it was checked as the code then checked it.
STORED = "stored"


DEFAULT_SLOS = SloSet(
    slos=[
        Slo(name="p95 wait ≤ 30 min", metric="wait_p95_s", max=1800.0),
        Slo(name="runtime failures ≤ 10 %", metric="runtime_failure_ratio", max=0.10),
        Slo(name="utilization ≥ 70 %", metric="utilization", min=0.70),
    ]
)


def load_slos(path: str | Path | None) -> SloSet:
    """The SLOs declared in a YAML file, or the defaults when no file is given."""
    if path is None:
        return DEFAULT_SLOS
    from twin.text_files import TextFileError, read_yaml

    path = Path(path)
    try:
        data = read_yaml(path)
    except TextFileError as exc:
        raise SloFormatError(str(exc)) from exc
    if isinstance(data, list):
        data = {"slos": data}
    if not isinstance(data, dict):  # an empty file, or a lone value (pydantic said "a valid dictionary")
        raise SloFormatError(f"{path}: expected a mapping with an 'slos' list (or that list alone)")
    try:
        return SloSet.model_validate(data)
    except ValidationError as exc:
        raise SloFormatError(f"{path}: {validation_message(exc, SloSet)}") from exc


def slo_values(slo: Slo, metrics: RunMetrics) -> tuple[float, list[float]]:
    """The whole-window value and the per-interval values (NaN where an interval has no data)."""
    if slo.metric == "utilization" and slo.gpu_model is not None:
        from twin.domain import canonical_gpu_name

        name = canonical_gpu_name(slo.gpu_model)
        whole = metrics.utilization_by_type.get(name, math.nan)
        series = metrics.utilization_by_type_series.get(name)
        return whole, [math.nan] * (len(metrics.edges_s) - 1) if series is None else series.tolist()
    return metrics.summary[_SUMMARY_FIGURE[slo.metric]], metrics.series[slo.metric].tolist()


def judge_intervals(slo: Slo, values: Sequence[float]) -> tuple[list[float], float]:
    """Per interval whether the SLO held (1/0, NaN where the interval has no data), and its attainment: the
    share of the intervals with data in which it held (NaN when none has). A forecast's runs and the
    store's record (`twin.slo_actual`) are judged alike."""
    held = [math.nan if math.isnan(v) else float(slo.holds(v)) for v in values]
    judged = [h for h in held if not math.isnan(h)]
    return held, float(sum(judged) / len(judged)) if judged else math.nan


def evaluate(slos: SloSet, metrics: RunMetrics) -> list[dict[str, Any]]:
    """Per SLO: `value` over the window, `met` (1/0), `attainment` (fraction of intervals with data), and
    `held` per interval (1/0, NaN without data)."""
    out: list[dict[str, Any]] = []
    for slo in slos.slos:
        whole, series = slo_values(slo, metrics)
        held, attainment = judge_intervals(slo, series)
        out.append(
            {
                "value": whole,
                "met": float(not math.isnan(whole) and slo.holds(whole)),
                "attainment": attainment,
                "held": held,
            }
        )
    return out
