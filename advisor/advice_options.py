"""The three options of an answer: the fewest GPUs, the best throughput and the best cost, among the
configurations likely to run."""

from __future__ import annotations

import math

from advisor import findings
from advisor.advice_answer import RECOMMEND_P_VALID, Answer, Choice, paper_evidence
from advisor.advice_schemas import Evidence

# Options within this fraction of the best are "as good"; the smaller batch (then fewer GPUs) wins among them:
# a larger batch adds little throughput (F3) and raises the failure risk (F1).
NEAR_BEST = 0.05


def near_best(candidates: list[int], score: dict[int, float], higher_is_better: bool) -> list[int]:
    best = max(score[i] for i in candidates) if higher_is_better else min(score[i] for i in candidates)
    if higher_is_better:
        return [i for i in candidates if score[i] >= best * (1 - NEAR_BEST)]
    return [i for i in candidates if score[i] <= best * (1 + NEAR_BEST)]


def fewest_gpus(answer: Answer, ladder: list[int], searched: list[int]) -> Choice | None:
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
        [paper_evidence(findings.PLACEMENT, p_valid_by_gpus={str(k): v for k, v in sorted(tried.items())})],
    )


def largest_batch_note(answer: Answer, chosen: int, pool: list[int]) -> Evidence:
    configs = answer.rows.configs
    same_gpus = [
        i
        for i in pool
        if configs[i].number_gpus == configs[chosen].number_gpus and math.isfinite(answer.p50(i))
    ]
    biggest = max(same_gpus, key=lambda i: configs[i].batch_size)
    return paper_evidence(
        findings.RIGHT_SIZING,
        chosen_batch=configs[chosen].batch_size,
        chosen_tokens_per_s=answer.p50(chosen),
        chosen_p_valid=answer.p_valid(chosen),
        largest_batch=configs[biggest].batch_size,
        largest_batch_gain=answer.p50(biggest) / answer.p50(chosen),
        largest_batch_p_valid=answer.p_valid(biggest),
    )


def best_throughput(answer: Answer, pool: list[int]) -> Choice | None:
    runs = [i for i in pool if answer.usable(i)]
    if not runs:
        return None
    configs = answer.rows.configs
    score = {i: answer.p50(i) for i in runs}
    near = near_best(runs, score, higher_is_better=True)
    best = min(near, key=lambda i: (configs[i].batch_size, configs[i].number_gpus, -answer.p_valid(i)))
    evidence = [
        largest_batch_note(answer, best, pool),
        paper_evidence(findings.FAILURE_BY_BATCH, p_valid=answer.p_valid(best)),
    ]
    if configs[best].number_nodes > 1:
        evidence.append(paper_evidence(findings.PLACEMENT, tokens_per_s=answer.p50(best)))
    return (
        best,
        f"highest predicted tokens/s among configurations likely to run (p >= {RECOMMEND_P_VALID}); "
        f"the smallest batch within {NEAR_BEST:.0%} of the best",
        evidence,
    )


def best_cost(answer: Answer, pool: list[int]) -> Choice | None:
    runs = [i for i in pool if answer.usable(i)]
    if not runs:
        return None
    configs = answer.rows.configs
    # GPU-seconds per token, divided by p_valid: a failed run has to be paid for and run again.
    score = {i: configs[i].number_gpus / answer.p50(i) / answer.p_valid(i) for i in runs}
    near = near_best(runs, score, higher_is_better=False)
    best = min(near, key=lambda i: (configs[i].batch_size, configs[i].number_gpus, score[i]))
    return (
        best,
        f"fewest risk-adjusted GPU-hours for the work (GPU-s per token / p_valid); the smallest batch "
        f"within {NEAR_BEST:.0%} of the cheapest",
        [
            largest_batch_note(answer, best, pool),
            paper_evidence(findings.PROVISIONING, gpu_seconds_per_mtoken=score[best] * 1e6),
        ],
    )
