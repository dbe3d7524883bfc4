"""The paper's findings that the advice rests on, with the published numbers it cites.

Source: Nicolae, Lotito, Iosup, "LLM Fine-Tuning Workloads: Characterization, Challenges, and Opportunities
for Serverless AI" (WoAIS '26), Sections 3-4, on IBM's LLMFineTuningBench (30,920 experiments). The numbers
are copied from the published figures (`shared/reference/paper_figures.json`, checked by a test) so that
the advisor works without that file; every piece of advice cites one of these next to its own predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    id: str
    where: str  # section / figure / table of the paper
    statement: str
    values: dict[str, Any] = field(default_factory=dict)  # the published numbers, by paper_figures.json key


ADMISSION = Finding(
    id="F1-F2",
    where="§3.1 (Finding 1-2, Implications); Table 3 'Admission control'",
    statement=(
        "63% of experiments fail; a rule check can repair a configuration (batch to a multiple of the GPUs) "
        "instead of rejecting it"
    ),
    values={
        "dataset.experiments": 30920,
        "dataset.rejected_before_launch": 9144,
        "dataset.failed_at_runtime": 10395,
        "rejection_rules.batch_size_not_multiple_of_gpus": 5360,
        "rejection_rules.gpus_not_multiple_of_expert_parallel_degree": 3784,
    },
)
FAILURE_BY_BATCH = Finding(
    id="F1",
    where="§3.1 Finding 1 (U-shaped, batch-driven failure ratio)",
    statement="the failure ratio is U-shaped in the batch size: 86% at batch 1, 42% at 8, 95% at 1,024",
    values={
        "failures_by_batch_size.failure_ratio_pct.1": 86,
        "failures_by_batch_size.failure_ratio_pct.8": 42,
        "failures_by_batch_size.failure_ratio_pct.1024": 95,
        "failures_by_batch_size.failure_ratio_pct_16_to_64": 52,
    },
)
RIGHT_SIZING = Finding(
    id="F3",
    where="§3.2 Finding 3, Figure 3; Table 3 'Right-sizing'",
    statement=(
        "throughput grows logarithmically with the batch: on one A100-SXM, batch 8 vs 1 gives 2.3x, "
        "batch 128 vs 8 only 1.5x; moderate batches are the all-round choice"
    ),
    values={
        "throughput_single_gpu.a100_sxm_gain_batch8_vs_1": 2.3,
        "throughput_single_gpu.a100_sxm_gain_batch128_vs_8": 1.5,
        "throughput_single_gpu.a100_sxm_median_tokens_per_s_by_batch.128": 9627,
    },
)
PLACEMENT = Finding(
    id="F4",
    where="§3.3 Finding 4, Figure 5; Table 3 'Placement'",
    statement=(
        "within a node throughput scales almost linearly (efficiency 0.94-1.00); from 8 to 16 GPUs, "
        "runs capped at 600 s gain 1.45x with RoCE but slow to 0.52x without it: keep jobs of up to 8 "
        "GPUs in one node"
    ),
    values={
        "scaling.intra_node_weak_efficiency_per_doubling": [0.94, 1.0],
        "scaling.gain_8_to_16_no_time_limit": [1.95, 1.96],
        "scaling.gain_8_to_16_600s_cap_with_roce": 1.45,
        "scaling.gain_8_to_16_600s_cap_without_roce": 0.52,
    },
)
ROCE = Finding(
    id="F5",
    where="§3.4 Finding 5, Figure 6a; Table 3 'Optimization choice'",
    statement=(
        "RoCE speeds up multi-node jobs by a median 2.16x (511 pairs): 2.89x for runs capped at 600 s, "
        "1.03x without a time limit; enable it for multi-node jobs after checking they benefit"
    ),
    values={
        "optimizations.roce_median_speedup_all": 2.16,
        "optimizations.roce_median_speedup_600s_cap": 2.89,
        "optimizations.roce_median_speedup_no_time_limit": 1.03,
    },
)
FAST_MOE = Finding(
    id="F6",
    where="§3.4 Finding 6, Figure 6b",
    statement=(
        "Fast MoE speeds MoE models up 1.69x when the experts stay on one GPU (EP=1; full 2.43x, "
        "LoRA 1.44x), only 1.16-1.33x when they spread, down to 0.92x for LoRA at EP=8"
    ),
    values={
        "optimizations.fast_moe_speedup_ep1": 1.69,
        "optimizations.fast_moe_speedup_ep1_full": 2.43,
        "optimizations.fast_moe_speedup_ep1_lora": 1.44,
        "optimizations.fast_moe_speedup_ep_gt1_range": [1.16, 1.33],
        "optimizations.fast_moe_speedup_lora_by_ep.8": 0.92,
    },
)
FAST_KERNELS = Finding(
    id="F6",
    where="§3.4 Finding 6, Figure 6c; §4 'enable Fast Kernels by default'",
    statement="Fast Kernels add a steady 1.12x (2,418 pairs, models up to 8B): enable them by default",
    values={
        "optimizations.fast_kernels_median_speedup": 1.12,
        "optimizations.fast_kernels_pairs": 2418,
        "optimizations.fast_kernels_models_max_params_billion": 8,
    },
)
PROVISIONING = Finding(
    id="F4-F6",
    where="§3.4 Implications; Table 3 'Provisioning'",
    statement="optimizations save 11-65% GPU hours (11% Fast Kernels, 65% RoCE for 600 s-capped runs)",
    values={"insights.provisioning": "optimizations save 11-65% GPU hours"},
)

ALL: tuple[Finding, ...] = (
    ADMISSION, FAILURE_BY_BATCH, RIGHT_SIZING, PLACEMENT, ROCE, FAST_MOE, FAST_KERNELS, PROVISIONING,
)  # fmt: skip


def lookup(document: dict[str, Any], dotted: str) -> Any:
    """A value of paper_figures.json by its dotted key (used by the test that checks the copies)."""
    value: Any = document
    for part in dotted.split("."):
        value = value[part]
    return value
