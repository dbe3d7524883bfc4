"""Advice for one job: will it run, a repair when the rules reject it, the fewest GPUs, the best
throughput and the best cost, placement and optimizations, each with the calibrated models' numbers and
the finding of the paper it rests on (`advisor.findings`).

Every configuration the answer weighs (the job as asked, its repair, placement and optimization
variants, the fewest-GPU ladder and the batch x GPUs x nodes grid) is predicted in ONE vectorized call
of the models, so an answer costs one model evaluation of ~100 rows; `advise_many` answers several
configurations with one call for all their rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from advisor import findings
from advisor.advice_io import (
    AdviceOut,
    Band,
    ChangeOut,
    ConfigOut,
    Evidence,
    OptimizationAdvice,
    Option,
    Placement,
    Prediction,
    Repair,
    Verdict,
    Work,
)
from advisor.candidates import Change, grid, is_moe, nodes_for, repair, with_batch_gpus
from advisor.prediction_memo import Predicted, PredictionMemo
from twin.domain import GPUS_PER_NODE, JobConfig, Rule, config_rule, gpu_type, model_params_b

# A configuration is recommended only if the failure model gives it at least this chance to run.
RECOMMEND_P_VALID = 0.7
# Below this, the verdict is "likely out of memory".
LIKELY_OOM_BELOW = 0.5
# Options within this fraction of the best are "as good"; the smaller batch (then fewer GPUs) wins among them:
# a larger batch adds little throughput (F3) and raises the failure risk (F1).
NEAR_BEST = 0.05
# RoCE is recommended for a multi-node job only when the models predict at least this gain.
ROCE_MIN_GAIN = 1.05
# When the request does not say how much work the job has, run times are for this many tokens (flagged).
DEFAULT_WORK_TOKENS = 1e8
BAND_COLUMNS = ("tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90")
MIN_GPU_LADDER: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32)


# A chosen configuration: (row index, why it was chosen, its evidence).
Choice = tuple[int, str, list[Evidence]]


class AdviceError(ValueError):
    """A configuration the advisor cannot reason about (the message says why)."""


class ModelsUnusable(RuntimeError):
    """The models in use failed to predict (e.g. saved by a version of finetwin with other features)."""


_RECORD_FIELDS = tuple(f.name for f in fields(JobConfig) if f.name != "extra")


def _record(config: JobConfig) -> dict[str, Any]:
    # Shallow, not dataclasses.asdict: its deep copy cost a third of a batch of answers.
    return {name: getattr(config, name) for name in _RECORD_FIELDS}


def predict(models: Any, configs: Sequence[JobConfig]) -> Predicted:
    """One vectorized evaluation of every configuration, power included (`predict_frame` when the models
    have it)."""
    n = len(configs)
    if hasattr(models, "predict_frame"):
        from calibrate.frames import configs_frame

        try:
            frame = models.predict_frame(configs_frame(_record(c) for c in configs), power=True)
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelsUnusable(f"the models in use cannot predict: {exc}") from exc
        p_valid = frame["p_valid"].to_numpy(dtype=float)
        tps = frame[list(BAND_COLUMNS)].to_numpy(dtype=float)
        watts = frame["power_watts"].to_numpy(dtype=float)
        notes = [n if isinstance(n, str) and n else None for n in frame.get("note", [None] * n)]
    else:
        p_valid = np.asarray(models.predict_failure(configs), dtype=float)
        tps = np.asarray(models.predict_throughput(configs), dtype=float).reshape(n, 3)
        watts = np.asarray(models.predict_power_watts(configs), dtype=float)
        notes = [None] * n
    return Predicted(p_valid=p_valid, tps=tps, watts=watts, notes=notes)


class _Rows:
    """The configurations to predict, deduplicated, each remembered by its index."""

    def __init__(self) -> None:
        self.configs: list[JobConfig] = []
        self._index: dict[JobConfig, int] = {}

    def add(self, config: JobConfig) -> int:
        if config_rule(config) is not None:
            raise AdviceError(f"internal: candidate breaks a rule: {config}")
        found = self._index.get(config)
        if found is None:
            found = self._index[config] = len(self.configs)
            self.configs.append(config)
        return found


def _evidence(finding: findings.Finding, **predicted: Any) -> Evidence:
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


class _Answer:
    """Builds the answer from the predictions (kept apart from the choosing logic for readability)."""

    def __init__(self, rows: _Rows, predicted: Predicted, work_tokens: float) -> None:
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
            return Prediction(p_valid=_num(self.p_valid(i)), tokens_per_second=None)
        low, mid, high = (max(float(v), 1e-9) for v in np.sort(band))
        config = self.rows.configs[i]
        run = Band(p10=self.work / high, p50=self.work / mid, p90=self.work / low)
        gpu_hours = config.number_gpus * run.p50 / 3600.0
        watts = self.watts_per_gpu(i)
        return Prediction(
            p_valid=_num(self.p_valid(i)),
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


def _num(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _near_best(candidates: list[int], score: dict[int, float], higher_is_better: bool) -> list[int]:
    best = max(score[i] for i in candidates) if higher_is_better else min(score[i] for i in candidates)
    if higher_is_better:
        return [i for i in candidates if score[i] >= best * (1 - NEAR_BEST)]
    return [i for i in candidates if score[i] <= best * (1 + NEAR_BEST)]


@dataclass
class _Plan:
    """Everything one answer weighs, before any prediction: the configurations and where each sits."""

    config: JobConfig
    dataset_tokens: float | None
    work: float
    notes: list[str]
    rule: Rule | None
    repaired: JobConfig
    changes: list[Change]
    placed: JobConfig
    tuned: JobConfig
    rows: _Rows
    i_asked: int | None
    i_repaired: int | None
    i_placed: int
    i_repaired_nodes: int
    kernels: dict[bool, int]
    roce: dict[bool, int]
    moe: dict[int, int]
    ladder: list[int]
    searched: list[int]
    # Not weighed by this answer, but by the next one in the same family: the asked job without fast
    # kernels (for the kernels' speedup) is one of these. Predicted only alongside rows that need a call.
    prefetch: list[JobConfig]


def _plan(config: JobConfig, dataset_tokens: float | None) -> _Plan:
    if model_params_b(config.model_name) is None:
        notes = [f"model size of {config.model_name!r} unknown: the models use a typical size"]
    else:
        notes = []
    work = dataset_tokens if dataset_tokens is not None else DEFAULT_WORK_TOKENS
    if dataset_tokens is None:
        notes.append(f"no dataset_tokens given: run times, GPU-hours and energy are for {work:,.0f} tokens")

    rule = config_rule(config)
    repaired, changes = repair(config)
    placed = repaired
    if repaired.number_gpus <= GPUS_PER_NODE and repaired.number_nodes > 1:
        placed = repaired.with_changes(number_nodes=1, enable_roce=False)
    elif repaired.number_gpus > GPUS_PER_NODE and repaired.number_gpus % nodes_for(repaired.number_gpus) == 0:
        placed = repaired.with_changes(number_nodes=nodes_for(repaired.number_gpus))
    tuned = placed.with_changes(fast_kernels=True)

    rows = _Rows()
    i_asked = rows.add(config) if rule is None else None
    i_repaired = rows.add(repaired) if changes else None
    i_placed = rows.add(placed)
    i_repaired_nodes = rows.add(repaired)
    kernels = {flag: rows.add(placed.with_changes(fast_kernels=flag)) for flag in (False, True)}
    roce = (
        {flag: rows.add(tuned.with_changes(enable_roce=flag)) for flag in (False, True)}
        if tuned.number_nodes > 1
        else {}
    )
    moe_degrees = sorted({0, 1, config.fast_moe} if is_moe(config) else set())
    moe = {
        ep: rows.add(tuned.with_changes(fast_moe=ep))
        for ep in moe_degrees
        if ep == 0 or tuned.number_gpus % ep == 0
    }
    ladder = [
        rows.add(c) for c in with_batch_gpus(tuned.with_changes(fast_moe=_moe_choice(tuned)), MIN_GPU_LADDER)
    ]
    searched = [rows.add(c) for c in grid(tuned.with_changes(fast_moe=0))]
    prefetch = [
        rows.configs[i].with_changes(fast_kernels=False) for i in searched if not rows.configs[i].enable_roce
    ]
    return _Plan(
        config, dataset_tokens, work, notes, rule, repaired, changes, placed, tuned, rows,
        i_asked, i_repaired, i_placed, i_repaired_nodes, kernels, roce, moe, ladder, searched, prefetch,
    )  # fmt: skip


def _compose(plan: _Plan, predicted: Predicted, model_version: str | None) -> AdviceOut:
    answer = _Answer(plan.rows, predicted, plan.work)
    notes = list(plan.notes)
    for i, note in enumerate(answer.p.notes):
        if note and note not in notes and i in (plan.i_asked, plan.i_repaired, plan.i_placed):
            notes.append(note)

    fewest = _fewest_gpus(answer, plan.ladder, plan.searched)
    fastest = _best_throughput(answer, plan.searched + plan.ladder)
    cheapest = _best_cost(answer, plan.searched + plan.ladder)

    repair_out = None
    if plan.changes:
        assert plan.i_repaired is not None
        repair_out = Repair(
            config=ConfigOut.of(plan.repaired),
            changes=[ChangeOut(field=c.field, old=c.old, new=c.new, why=c.why) for c in plan.changes],
            prediction=answer.prediction(plan.i_repaired),
            evidence=[_evidence(findings.ADMISSION, repaired_p_valid=answer.p_valid(plan.i_repaired))],
        )
    config = plan.config
    return AdviceOut(
        model_version=model_version,
        config=ConfigOut.of(config),
        work=Work(dataset_tokens=plan.work, assumed=plan.dataset_tokens is None),
        verdict=_verdict(answer, config, plan.rule, plan.i_asked, plan.i_repaired),
        repair=repair_out,
        fewest_gpus=answer.option(fewest),
        best_throughput=answer.option(fastest),
        best_cost=answer.option(cheapest),
        placement=_placement(answer, plan.repaired, plan.placed, plan.i_repaired_nodes, plan.i_placed),
        optimizations=[
            _fast_kernels(answer, plan.kernels, config),
            _fast_moe(answer, plan.moe, config),
            _roce(answer, plan.roce, plan.tuned),
        ],
        notes=notes,
    )


def candidate_rows(config: JobConfig) -> tuple[list[JobConfig], list[JobConfig]]:
    """(the configurations an answer for `config` weighs, those it prefetches for its family)."""
    plan = _plan(config, None)
    return plan.rows.configs, plan.prefetch


def advise_job(
    config: JobConfig, dataset_tokens: float | None, models: Any, model_version: str | None = None
) -> AdviceOut:
    """The whole answer for one configuration (see the module docstring)."""
    answer = advise_many([(config, dataset_tokens)], models, model_version)[0]
    if isinstance(answer, AdviceError):
        raise answer
    return answer


def advise_many(
    jobs: Sequence[tuple[JobConfig, float | None]],
    models: Any,
    model_version: str | None = None,
    memo: PredictionMemo | None = None,
) -> list[AdviceOut | AdviceError]:
    """Answers for several configurations with ONE model call for all their rows: the models' fixed cost
    per call (~40 ms) dwarfs the cost per row, so concurrent requests answered together cost little more
    than one. A configuration the advisor cannot reason about gets its AdviceError in its place; the
    others are answered. ModelsUnusable fails them all. With a `memo` (of these models' version), rows
    predicted before are not predicted again."""
    plans: list[_Plan | AdviceError] = []
    for config, dataset_tokens in jobs:
        try:
            plans.append(_plan(config, dataset_tokens))
        except AdviceError as exc:
            plans.append(exc)
    configs = [c for plan in plans if isinstance(plan, _Plan) for c in plan.rows.configs]
    if memo is None:
        predicted = predict(models, configs)
    else:
        prefetch = [c for plan in plans if isinstance(plan, _Plan) for c in plan.prefetch]
        predicted = memo.predict(configs, lambda missing: predict(models, missing), prefetch)
    answers: list[AdviceOut | AdviceError] = []
    start = 0
    for plan in plans:
        if isinstance(plan, AdviceError):
            answers.append(plan)
            continue
        stop = start + len(plan.rows.configs)
        answers.append(_compose(plan, predicted.rows(start, stop), model_version))
        start = stop
    return answers


def _moe_choice(config: JobConfig) -> int:
    """Experts on one GPU (EP=1) for MoE models, per F6; the ladder and grid then include it."""
    return 1 if is_moe(config) else 0


def _verdict(
    answer: _Answer, config: JobConfig, rule: Any, i_asked: int | None, i_repaired: int | None
) -> Verdict:
    if rule is not None:
        repaired_p = answer.p_valid(i_repaired) if i_repaired is not None else math.nan
        return Verdict(
            status="rejected",
            rule=rule.value,
            p_valid=None,
            p_oom=None,
            message=f"the actuator rejects it before launch: {rule.value.replace('_', ' ')}; see the repair",
            evidence=[_evidence(findings.ADMISSION, broken_rule=rule.value, repaired_p_valid=repaired_p)],
        )
    assert i_asked is not None
    p_valid = answer.p_valid(i_asked)
    status = "valid" if p_valid >= LIKELY_OOM_BELOW else "likely_oom"
    if status == "valid":
        message = f"passes the admission rules and runs with probability {p_valid:.2f}"
    else:
        message = f"passes the admission rules but likely runs out of memory (p = {1 - p_valid:.2f})"
    return Verdict(
        status=status,
        p_valid=_num(p_valid),
        p_oom=_num(1 - p_valid),
        message=message,
        prediction=answer.prediction(i_asked),
        evidence=[_evidence(findings.FAILURE_BY_BATCH, batch_size=config.batch_size, p_valid=p_valid)],
    )


def _fewest_gpus(answer: _Answer, ladder: list[int], searched: list[int]) -> Choice | None:
    configs = answer.rows.configs
    tried = {configs[i].number_gpus: answer.p_valid(i) for i in ladder}
    runs = [i for i in ladder if answer.usable(i)]
    why = "the fewest GPUs that run the job's own batch"
    if not runs:  # the job's batch does not run anywhere: the fewest GPUs with another batch
        runs = [i for i in searched if answer.usable(i)]
        why = "no GPU count runs the job's own batch; the fewest GPUs with the nearest batch that runs"
        if not runs:
            return None
        asked = configs[ladder[0]].batch_size if ladder else 1
        fewest = min(configs[i].number_gpus for i in runs)
        runs = [i for i in runs if configs[i].number_gpus == fewest]
        best = min(runs, key=lambda i: (abs(math.log2(configs[i].batch_size / asked)), -answer.p50(i)))
    else:
        best = min(runs, key=lambda i: (configs[i].number_gpus, -answer.p50(i)))
    return (
        best,
        why,
        [_evidence(findings.PLACEMENT, p_valid_by_gpus={str(k): v for k, v in sorted(tried.items())})],
    )


def _largest_batch_note(answer: _Answer, chosen: int, pool: list[int]) -> Evidence:
    configs = answer.rows.configs
    same_gpus = [
        i
        for i in pool
        if configs[i].number_gpus == configs[chosen].number_gpus and math.isfinite(answer.p50(i))
    ]
    biggest = max(same_gpus, key=lambda i: configs[i].batch_size)
    return _evidence(
        findings.RIGHT_SIZING,
        chosen_batch=configs[chosen].batch_size,
        chosen_tokens_per_s=answer.p50(chosen),
        chosen_p_valid=answer.p_valid(chosen),
        largest_batch=configs[biggest].batch_size,
        largest_batch_gain=answer.p50(biggest) / answer.p50(chosen),
        largest_batch_p_valid=answer.p_valid(biggest),
    )


def _best_throughput(answer: _Answer, pool: list[int]) -> Choice | None:
    runs = [i for i in pool if answer.usable(i)]
    if not runs:
        return None
    configs = answer.rows.configs
    score = {i: answer.p50(i) for i in runs}
    near = _near_best(runs, score, higher_is_better=True)
    best = min(near, key=lambda i: (configs[i].batch_size, configs[i].number_gpus, -answer.p_valid(i)))
    evidence = [
        _largest_batch_note(answer, best, pool),
        _evidence(findings.FAILURE_BY_BATCH, p_valid=answer.p_valid(best)),
    ]
    if configs[best].number_nodes > 1:
        evidence.append(_evidence(findings.PLACEMENT, tokens_per_s=answer.p50(best)))
    return (
        best,
        f"highest predicted tokens/s among configurations likely to run (p >= {RECOMMEND_P_VALID}); "
        f"the smallest batch within {NEAR_BEST:.0%} of the best",
        evidence,
    )


def _best_cost(answer: _Answer, pool: list[int]) -> Choice | None:
    runs = [i for i in pool if answer.usable(i)]
    if not runs:
        return None
    configs = answer.rows.configs
    # GPU-seconds per token, divided by p_valid: a failed run has to be paid for and run again.
    score = {i: configs[i].number_gpus / answer.p50(i) / answer.p_valid(i) for i in runs}
    near = _near_best(runs, score, higher_is_better=False)
    best = min(near, key=lambda i: (configs[i].batch_size, configs[i].number_gpus, score[i]))
    return (
        best,
        f"fewest risk-adjusted GPU-hours for the work (GPU-s per token / p_valid); the smallest batch "
        f"within {NEAR_BEST:.0%} of the cheapest",
        [
            _largest_batch_note(answer, best, pool),
            _evidence(findings.PROVISIONING, gpu_seconds_per_mtoken=score[best] * 1e6),
        ],
    )


def _placement(
    answer: _Answer, repaired: JobConfig, placed: JobConfig, i_asked: int, i_placed: int
) -> Placement:
    per_node = placed.number_gpus // placed.number_nodes
    moved = placed.number_nodes != repaired.number_nodes
    if moved and placed.number_nodes == 1:
        message = (
            f"run the {placed.number_gpus} GPUs in one node instead of {repaired.number_nodes}: "
            f"predicted {answer.p50(i_placed):,.0f} vs {answer.p50(i_asked):,.0f} tokens/s"
        )
    elif placed.number_nodes == 1:
        message = f"{placed.number_gpus} GPU(s) in one node (up to {GPUS_PER_NODE} per node)"
    else:
        message = (
            f"{placed.number_nodes} nodes of {per_node} GPUs: over {GPUS_PER_NODE} GPUs need several nodes"
        )
    return Placement(
        number_nodes=placed.number_nodes,
        gpus_per_node=per_node,
        single_node=placed.number_nodes == 1,
        message=message,
        evidence=[
            _evidence(
                findings.PLACEMENT,
                tokens_per_s_as_placed=answer.p50(i_placed),
                tokens_per_s_as_asked=answer.p50(i_asked),
            )
        ],
    )


def _speedup(answer: _Answer, with_it: int, without: int) -> float | None:
    ratio = answer.p50(with_it) / answer.p50(without)
    return float(ratio) if math.isfinite(ratio) else None


def _fast_kernels(answer: _Answer, rows: dict[bool, int], config: JobConfig) -> OptimizationAdvice:
    speedup = _speedup(answer, rows[True], rows[False])
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
        evidence=[_evidence(findings.FAST_KERNELS, speedup=speedup or math.nan)],
    )


def _fast_moe(answer: _Answer, rows: dict[int, int], config: JobConfig) -> OptimizationAdvice:
    if not rows:
        return OptimizationAdvice(
            name="fast_moe", recommended=False, setting=0, predicted_speedup=None,
            message="not a mixture-of-experts model", evidence=[],
        )  # fmt: skip
    speedups = {ep: _speedup(answer, i, rows[0]) for ep, i in rows.items() if ep > 0}
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
        evidence=[_evidence(findings.FAST_MOE, speedup_by_ep={str(k): v for k, v in speedups.items()})],
    )


def _roce(answer: _Answer, rows: dict[bool, int], config: JobConfig) -> OptimizationAdvice:
    if not rows:
        return OptimizationAdvice(
            name="enable_roce", recommended=False, setting=False, predicted_speedup=None,
            message="single-node job: RoCE only speeds up traffic between nodes", evidence=[],
        )  # fmt: skip
    speedup = _speedup(answer, rows[True], rows[False])
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
            _evidence(
                findings.ROCE,
                speedup=speedup or math.nan,
                time_limit_s=config.time_limit_s if config.time_limit_s is not None else "none",
            )
        ],
    )
