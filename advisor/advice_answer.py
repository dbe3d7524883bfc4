"""Reading an answer out of the predictions: one configuration's prediction (band, run time, GPU-hours,
energy), an option, and the paper's evidence with the predicted numbers beside it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from advisor import findings
from advisor.advice_plan import Rows
from advisor.advice_predict import Predicted
from advisor.advice_schemas import Band, ConfigOut, Evidence, Option, Prediction
from twin.domain import gpu_type
from twin.jsonsafe import finite_or_none

# A configuration is recommended only if the failure model gives it at least this chance to run.
RECOMMEND_P_VALID = 0.7

# A chosen configuration: (row index, why it was chosen, its evidence).
Choice = tuple[int, str, list[Evidence]]


class Answer:
    """Builds the answer from the predictions (kept apart from the choosing logic for readability)."""

    def __init__(self, rows: Rows, predicted: Predicted, work_tokens: float) -> None:
        self.rows = rows
        self.p = predicted
        self.work = work_tokens

    def watts_per_gpu(self, i: int) -> float:
        watts = float(self.p.watts[i])
        return watts if math.isfinite(watts) else gpu_type(self.rows.configs[i].gpu_model).tdp_watts

    def p_valid(self, i: int) -> float:
        return float(self.p.p_valid[i])

    def p50(self, i: int) -> float:
        value = float(self.p.tps[i, 1])
        return value if math.isfinite(value) and value > 0 else math.nan

    def usable(self, i: int) -> bool:
        return math.isfinite(self.p50(i)) and self.p_valid(i) >= RECOMMEND_P_VALID

    def prediction(self, i: int) -> Prediction | None:
        band = self.p.tps[i]
        if not np.all(np.isfinite(band)) or band[1] <= 0:
            return Prediction(p_valid=finite_or_none(self.p_valid(i)), tokens_per_second=None)
        low, mid, high = (max(float(v), 1e-9) for v in np.sort(band))
        config = self.rows.configs[i]
        run = Band(p10=self.work / high, p50=self.work / mid, p90=self.work / low)
        gpu_hours = config.number_gpus * run.p50 / 3600.0
        watts = self.watts_per_gpu(i)
        return Prediction(
            p_valid=finite_or_none(self.p_valid(i)),
            tokens_per_second=Band(p10=low, p50=mid, p90=high),
            run_time_s=run,
            gpu_hours=gpu_hours,
            energy_kwh=watts * gpu_hours / 1000.0,
        )

    def option(self, choice: Choice | None) -> Option | None:
        if choice is None:
            return None
        i, why, evidence = choice
        config = self.rows.configs[i]
        prediction = self.prediction(i)
        assert prediction is not None
        return Option(
            config=ConfigOut.of(config),
            workers=config.number_nodes,
            gpus_per_worker=config.number_gpus // config.number_nodes,
            prediction=prediction,
            why=why,
            evidence=evidence,
        )


def paper_evidence(finding: findings.Finding, **predicted: Any) -> Evidence:
    return Evidence(
        finding=finding.id,
        where=finding.where,
        statement=finding.statement,
        paper=dict(finding.values),
        predicted={k: _round(v) for k, v in predicted.items()},
    )


def _round(value: Any) -> Any:
    if isinstance(value, float | np.floating):
        return float(f"{float(value):.4g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value
