"""Which optimizations to switch on: fast kernels by default, fast MoE when the models predict a gain at a
degree that runs, RoCE for multi-node jobs that gain enough from it."""

from __future__ import annotations

import math

from advisor import findings
from advisor.advice_answer import RECOMMEND_P_VALID, Answer, paper_evidence
from advisor.advice_schemas import OptimizationAdvice
from twin.domain import JobConfig, model_params_b

# RoCE is recommended for a multi-node job only when the models predict at least this gain.
ROCE_MIN_GAIN = 1.05


def speedup_of(answer: Answer, with_it: int, without: int) -> float | None:
    ratio = answer.p50(with_it) / answer.p50(without)
    return float(ratio) if math.isfinite(ratio) else None


def fast_kernels_advice(answer: Answer, rows: dict[bool, int], config: JobConfig) -> OptimizationAdvice:
    speedup = speedup_of(answer, rows[True], rows[False])
    size = model_params_b(config.model_name)
    caveat = (
        ""
        if size is None or size <= 8
        else f"; the paper's pairs cover models up to 8B, this one is {size:g}B"
    )
    return OptimizationAdvice(
        name="fast_kernels",
        recommended=True,
        setting=True,
        predicted_speedup=speedup,
        message=f"on by default: predicted {speedup or float('nan'):.2f}x{caveat}",
        evidence=[paper_evidence(findings.FAST_KERNELS, speedup=speedup or math.nan)],
    )


def fast_moe_advice(answer: Answer, rows: dict[int, int], config: JobConfig) -> OptimizationAdvice:
    if not rows:
        return OptimizationAdvice(
            name="fast_moe", recommended=False, setting=0, predicted_speedup=None,
            message="not a mixture-of-experts model", evidence=[],
        )  # fmt: skip
    speedups = {ep: speedup_of(answer, i, rows[0]) for ep, i in rows.items() if ep > 0}
    best_ep = max(speedups, key=lambda ep: (speedups[ep] or 0.0, -ep), default=0)
    gain = speedups.get(best_ep)
    runs = answer.p_valid(rows[best_ep]) >= RECOMMEND_P_VALID if best_ep else False
    recommended = gain is not None and gain > 1.0 and runs
    if recommended:
        message = f"expert-parallel degree {best_ep}: predicted {gain:.2f}x"
    elif gain is not None and gain > 1.0:
        message = f"predicted {gain:.2f}x at degree {best_ep}, but that configuration is unlikely to run"
    else:
        message = "no predicted gain from Fast MoE for this configuration"
    return OptimizationAdvice(
        name="fast_moe",
        recommended=recommended,
        setting=best_ep if recommended else 0,
        predicted_speedup=gain,
        message=message,
        evidence=[paper_evidence(findings.FAST_MOE, speedup_by_ep={str(k): v for k, v in speedups.items()})],
    )


def roce_advice(answer: Answer, rows: dict[bool, int], config: JobConfig) -> OptimizationAdvice:
    if not rows:
        return OptimizationAdvice(
            name="enable_roce", recommended=False, setting=False, predicted_speedup=None,
            message="single-node job: RoCE only speeds up traffic between nodes", evidence=[],
        )  # fmt: skip
    speedup = speedup_of(answer, rows[True], rows[False])
    recommended = speedup is not None and speedup >= ROCE_MIN_GAIN
    return OptimizationAdvice(
        name="enable_roce",
        recommended=recommended,
        setting=recommended,
        predicted_speedup=speedup,
        message=(
            f"multi-node job: predicted {speedup or float('nan'):.2f}x with RoCE"
            + ("" if recommended else f" (below the {ROCE_MIN_GAIN:.2f}x worth enabling it for)")
        ),
        evidence=[
            paper_evidence(
                findings.ROCE,
                speedup=speedup or math.nan,
                time_limit_s=config.time_limit_s if config.time_limit_s is not None else "none",
            )
        ],
    )
