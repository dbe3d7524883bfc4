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
from typing import Any

from advisor import findings
from advisor.advice_answer import (
    EXTRAPOLATED,
    RECOMMEND_P_VALID,
    RECOMMEND_P_VALID_LOW,
    Answer,
    paper_evidence,
)
from advisor.advice_optimizations import fast_kernels_advice, fast_moe_advice, roce_advice
from advisor.advice_options import best_cost, best_throughput, fewest_gpus
from advisor.advice_plan import AdviceError, Plan, plan_advice
from advisor.advice_predict import Predicted, predict
from advisor.advice_schemas import AdviceOut, ChangeOut, ConfigOut, Placement, Repair, Verdict, Work
from twin.domain import GPUS_PER_NODE, JobConfig
from twin.jsonsafe import finite_or_none

# Below this, the verdict is "likely out of memory".
LIKELY_OOM_BELOW = 0.5


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
    min_p_valid_low: float = RECOMMEND_P_VALID_LOW,
) -> list[AdviceOut | AdviceError]:
    """Answers for several configurations with one model call for all their rows. A configuration the
    advisor cannot reason about gets its AdviceError in its place; the others are answered.
    ModelsUnusable fails them all. `min_p_valid_low`: the lower bound on p_valid a recommendation needs
    (0: the point estimate alone decides, as before the bound; for `bench/accuracy.py --advice`)."""
    plans: list[Plan | AdviceError] = []
    for config, dataset_tokens in jobs:
        try:
            plans.append(plan_advice(config, dataset_tokens))
        except AdviceError as exc:
            plans.append(exc)
    configs = [c for plan in plans if isinstance(plan, Plan) for c in plan.rows.configs]
    predicted = predict(models, configs)
    answers: list[AdviceOut | AdviceError] = []
    start = 0
    for plan in plans:
        if isinstance(plan, AdviceError):
            answers.append(plan)
            continue
        stop = start + len(plan.rows.configs)
        answers.append(_compose(plan, predicted.rows(start, stop), model_version, min_p_valid_low))
        start = stop
    return answers


def _compose(
    plan: Plan, predicted: Predicted, model_version: str | None, min_p_valid_low: float
) -> AdviceOut:
    answer = Answer(plan.rows, predicted, plan.work, min_p_valid_low)
    notes = list(plan.notes)
    for i, note in enumerate(answer.p.notes):
        if note and note not in notes and i in (plan.i_asked, plan.i_repaired, plan.i_placed):
            notes.append(note)

    asked = next((i for i in (plan.i_asked, plan.i_repaired, plan.i_placed) if i is not None), None)
    cut_off = answer.cut_off(asked) if asked is not None else None
    if cut_off is not None:
        notes.append(cut_off)

    fewest = fewest_gpus(answer, plan.ladder, plan.searched)
    fastest = best_throughput(answer, plan.searched + plan.ladder)
    cheapest = best_cost(answer, plan.searched + plan.ladder)

    pool = plan.searched + plan.ladder
    if fewest is None and fastest is None:  # no option at all: say how far the search went, and how close
        notes.append(_nothing_likely(answer, pool))
    repair_out = None
    if plan.changes:
        assert plan.i_repaired is not None
        i = plan.i_repaired
        # Not confident in the repair: the usable configuration closest to it is the one to follow.
        alternative = answer.next_safest(pool, {i}, near=i)
        repair_out = Repair(
            config=ConfigOut.of(plan.repaired),
            changes=[ChangeOut(field=c.field, old=c.old, new=c.new, why=c.why) for c in plan.changes],
            prediction=answer.prediction(i),
            evidence=[paper_evidence(findings.ADMISSION, repaired_p_valid=answer.p_valid(i))],
            confident=answer.usable(i),
            confidence=answer.confidence(i),
            alternative=answer.option(
                None
                if alternative is None
                else (alternative, "the configuration closest to the repair that is likely to run", [])
            ),
        )
    config = plan.config
    return AdviceOut(
        model_version=model_version,
        config=ConfigOut.of(config),
        work=Work(dataset_tokens=plan.work, assumed=plan.dataset_tokens is None),
        verdict=_verdict(answer, config, plan.rule, plan.i_asked, plan.i_repaired),
        repair=repair_out,
        fewest_gpus=answer.option(fewest, _next_safest(answer, fewest, pool)),
        best_throughput=answer.option(fastest, _next_safest(answer, fastest, pool)),
        best_cost=answer.option(cheapest, _next_safest(answer, cheapest, pool)),
        placement=_placement(answer, plan.repaired, plan.placed, plan.i_repaired_nodes, plan.i_placed),
        optimizations=[
            fast_kernels_advice(answer, plan.kernels, config),
            fast_moe_advice(answer, plan.moe, config),
            roce_advice(answer, plan.roce, plan.tuned),
        ],
        notes=notes,
    )


def _nothing_likely(answer: Answer, pool: list[int]) -> str:
    """What the search for options covered when none of it is likely to run, and the likeliest it found:
    'none found' alone left an operator to guess whether more GPUs or another batch were tried."""
    configs = answer.rows.configs
    searched = list(dict.fromkeys(pool))
    if not searched:
        return "no configuration of this job was searched"
    gpus = sorted({configs[i].number_gpus for i in searched})
    batches = sorted({configs[i].batch_size for i in searched})
    nodes = max(configs[i].number_nodes for i in searched)
    scope = (
        f"none of the {len(searched)} configurations searched ({gpus[0]}-{gpus[-1]} GPUs on up to {nodes} "
        f"node(s), batch {batches[0]:,}-{batches[-1]:,}, with the job's model, method, GPU type and sequence "
        "length)"
    )
    likely = [i for i in searched if answer.p_valid(i) >= RECOMMEND_P_VALID]
    sure = [i for i in likely if answer.p_valid_low(i) >= answer.min_p_valid_low]
    if sure:  # each of them an extrapolation, or it would have been recommended
        return (
            f"{scope} is recommended: {len(sure)} are likely to run by the failure model, but each is "
            f"{EXTRAPOLATED} (the notes say which sizes)"
        )
    if likely:  # likely to run by the point estimate, but none surely enough: say that, not "unlikely"
        safest = max(
            likely, key=lambda i: (answer.p_valid_low(i), answer.p_valid(i), -configs[i].number_gpus)
        )
        config = configs[safest]
        return (
            f"{scope} is sure enough to recommend: {len(likely)} are likely to run, but the failure model is "
            f"unsure of configurations like these; the safest, {config.number_gpus} GPU(s) at batch "
            f"{config.batch_size:,}, runs with p = {answer.p_valid(safest):.2f} but only at least "
            f"{answer.p_valid_low(safest):.2f} with 95 % confidence, where a recommendation needs "
            f"{answer.min_p_valid_low}"
        )
    likeliest = max(searched, key=lambda i: (answer.p_valid(i), -configs[i].number_gpus))
    config = configs[likeliest]
    return (
        f"{scope} is likely to run; the likeliest, {config.number_gpus} GPU(s) at batch "
        f"{config.batch_size:,}, runs with p = {answer.p_valid(likeliest):.2f} (at least "
        f"{answer.p_valid_low(likeliest):.2f} with 95 % confidence), where an option needs p >= "
        f"{RECOMMEND_P_VALID} and a bound of at least {answer.min_p_valid_low}"
    )


def _next_safest(answer: Answer, choice: Any, pool: list[int]) -> int | None:
    return None if choice is None else answer.next_safest(pool, {choice[0]}, near=choice[0])


def _verdict(
    answer: Answer, config: JobConfig, rule: Any, i_asked: int | None, i_repaired: int | None
) -> Verdict:
    if rule is not None:
        repaired_p = answer.p_valid(i_repaired) if i_repaired is not None else math.nan
        return Verdict(
            status="rejected",
            rule=rule.value,
            p_valid=None,
            p_oom=None,
            message=f"the actuator rejects it before launch: {rule.value.replace('_', ' ')}; see the repair",
            evidence=[
                paper_evidence(findings.ADMISSION, broken_rule=rule.value, repaired_p_valid=repaired_p)
            ],
        )
    assert i_asked is not None
    p_valid = answer.p_valid(i_asked)
    status = "valid" if p_valid >= LIKELY_OOM_BELOW else "likely_oom"
    if status == "valid":
        message = f"passes the admission rules and runs with probability {p_valid:.2f}"
        low = answer.p_valid_low(i_asked)
        if answer.extrapolated(i_asked):
            message += f", but it is {EXTRAPOLATED}"
        elif math.isfinite(low) and not answer.safe(i_asked):
            # Else "runs with probability 1.00" stood beside "none found that is likely to run" unexplained.
            message += (
                f", but only at least {low:.2f} with 95 % confidence: the failure model is unsure of "
                f"configurations like it (a recommendation needs {answer.min_p_valid_low})"
            )
    else:
        message = f"passes the admission rules but likely runs out of memory (p = {1 - p_valid:.2f})"
    return Verdict(
        status=status,
        p_valid=finite_or_none(p_valid),
        p_oom=finite_or_none(1 - p_valid),
        message=message,
        prediction=answer.prediction(i_asked),
        evidence=[paper_evidence(findings.FAILURE_BY_BATCH, batch_size=config.batch_size, p_valid=p_valid)],
    )


def _placement(
    answer: Answer, repaired: JobConfig, placed: JobConfig, i_asked: int, i_placed: int
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
            paper_evidence(
                findings.PLACEMENT,
                tokens_per_s_as_placed=answer.p50(i_placed),
                tokens_per_s_as_asked=answer.p50(i_asked),
            )
        ],
    )
