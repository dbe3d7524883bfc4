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
from twin.domain import JobConfig, gpu_type
from twin.jsonsafe import finite_or_none

# A configuration is recommended only if the failure model gives it at least this chance to run (point
# estimate) ...
RECOMMEND_P_VALID = 0.7
# ... and its calibrated lower bound on that chance is at least this (issue 14: advice an operator can follow;
# chosen so that >= 97 % of recommendations checked against held-out real runs ran, `bench/accuracy.py
# --advice`). 0 ranks on the point estimate alone (the behaviour before the bound, for the bench).
RECOMMEND_P_VALID_LOW = 0.9

EXTRAPOLATED = "beyond the sizes the models learned from, so its numbers are an extrapolation, not evidence"
NEXT_SAFEST = "the next-safest: the closest configuration with at least as high a lower bound on p_valid"

# A chosen configuration: (row index, why it was chosen, its evidence).
Choice = tuple[int, str, list[Evidence]]


class Answer:
    """Builds the answer from the predictions (kept apart from the choosing logic for readability)."""

    def __init__(
        self,
        rows: Rows,
        predicted: Predicted,
        work_tokens: float,
        min_p_valid_low: float = RECOMMEND_P_VALID_LOW,
    ) -> None:
        self.rows = rows
        self.p = predicted
        self.work = work_tokens
        self.min_p_valid_low = min_p_valid_low

    def watts_per_gpu(self, i: int) -> float:
        watts = float(self.p.watts[i])
        return watts if math.isfinite(watts) else gpu_type(self.rows.configs[i].gpu_model).tdp_watts

    def p_valid(self, i: int) -> float:
        return float(self.p.p_valid[i])

    def p_valid_low(self, i: int) -> float:
        return float(self.p.p_valid_low[i])

    def extrapolated(self, i: int) -> bool:
        return bool(self.p.extrapolated[i])

    def safe(self, i: int) -> bool:
        """Its lower bound on p_valid meets the threshold (NaN never does), and it is no extrapolation: a
        repair to 1,000,000 GPUs was recommended with "confidence high" from runs of 1-32."""
        return self.p_valid_low(i) >= self.min_p_valid_low and not self.extrapolated(i)

    def confidence(self, i: int) -> str:
        low = self.p_valid_low(i)
        if not math.isfinite(low):
            return "unknown: no lower bound on p_valid"
        if self.extrapolated(i):
            return f"low: {EXTRAPOLATED} (p_valid {self.p_valid(i):.2f}, bound {low:.2f})"
        level = "high" if self.safe(i) else "low"
        point = self.p_valid(i)
        return f"{level}: runs with probability at least {low:.2f} (95 % bound; point estimate {point:.2f})"

    def p50(self, i: int) -> float:
        value = float(self.p.tps[i, 1])
        return value if math.isfinite(value) and value > 0 else math.nan

    def usable(self, i: int) -> bool:
        return math.isfinite(self.p50(i)) and self.p_valid(i) >= RECOMMEND_P_VALID and self.safe(i)

    def next_safest(self, pool: list[int], exclude: set[int], near: int | None = None) -> int | None:
        """The usable row of `pool` (not in `exclude`) with the highest lower bound on p_valid; with `near`,
        the closest to that configuration (same GPU count, then the nearest batch) among those at least as
        safe as it, else the safest."""
        configs = self.rows.configs
        runs = [i for i in dict.fromkeys(pool) if i not in exclude and self.usable(i)]
        if not runs:
            return None
        if near is None:
            return max(runs, key=lambda i: (self.p_valid_low(i), -configs[i].number_gpus, self.p50(i)))
        to, floor = configs[near], self.p_valid_low(near)
        return min(
            runs,
            key=lambda i: (
                not self.p_valid_low(i) >= floor,
                abs(configs[i].number_gpus - to.number_gpus),
                abs(math.log2(configs[i].batch_size / to.batch_size)),
                -self.p_valid_low(i),
            ),
        )

    def prediction(self, i: int) -> Prediction | None:
        band = self.p.tps[i]
        if not np.all(np.isfinite(band)) or band[1] <= 0:
            return Prediction(
                p_valid=finite_or_none(self.p_valid(i)),
                p_valid_low=finite_or_none(self.p_valid_low(i)),
                tokens_per_second=None,
            )
        low, mid, high = (max(float(v), 1e-9) for v in np.sort(band))
        config = self.rows.configs[i]
        cap = time_cap(config)  # a capped run stops there, done or not: as the twin runs it (`twin.plan`)
        run = Band(
            p10=min(self.work / high, cap), p50=min(self.work / mid, cap), p90=min(self.work / low, cap)
        )
        gpu_hours = config.number_gpus * run.p50 / 3600.0
        watts = self.watts_per_gpu(i)
        return Prediction(
            p_valid=finite_or_none(self.p_valid(i)),
            p_valid_low=finite_or_none(self.p_valid_low(i)),
            tokens_per_second=Band(p10=low, p50=mid, p90=high),
            run_time_s=run,
            gpu_hours=gpu_hours,
            energy_kwh=watts * gpu_hours / 1000.0,
        )

    def cut_off(self, i: int) -> str | None:
        """A note when the configuration's time limit stops the run before its work is done (at p50)."""
        config = self.rows.configs[i]
        mid = self.p50(i)
        if config.time_limit_s is None or not math.isfinite(mid) or self.work / mid <= config.time_limit_s:
            return None
        done = mid * config.time_limit_s
        return (
            f"time_limit_s stops the run at {config.time_limit_s:,.0f} s, before its work is done: at "
            f"{mid:,.0f} tokens/s (p50) it processes {done:,.0f} of the {self.work:,.0f} tokens "
            f"({done / self.work:.1%}); run times, GPU-hours and energy are for the run as capped"
        )

    def option(self, choice: Choice | None, alternative: int | None = None) -> Option | None:
        """The chosen row as an option, with the next-safest `alternative` row beside it."""
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
            confidence=self.confidence(i),
            alternative=None if alternative is None else self.option((alternative, NEXT_SAFEST, [])),
        )


def time_cap(config: JobConfig) -> float:
    """The longest the configuration's run lasts: its time limit, or no limit."""
    return math.inf if config.time_limit_s is None else float(config.time_limit_s)


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
