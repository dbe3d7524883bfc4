"""The report's numbers on small hand-made files, against values worked out by hand in each test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from calibrate.loader import load_benchmark
from calibrate.report import compute_numbers
from tests.report.conftest import CAPPED, PCIE, SXM, UNCAPPED, row, write_bench


def numbers_of(tmp_path: Path, rows: list[dict[str, str]]) -> dict[str, Any]:
    return compute_numbers(load_benchmark(write_bench(tmp_path / "bench.csv", rows)), source="hand-made")


def test_outcomes_table1_and_failures_by_batch_size(tmp_path: Path) -> None:
    numbers = numbers_of(
        tmp_path,
        [
            row(tps=1000, gpus=1, batch=8),  # valid
            row(tps=1800, gpus=2, batch=8),  # valid
            row(gpus=2, batch=3),  # rejected: the GPUs do not divide the batch
            row(gpus=2, batch=4, fast_moe=4),  # rejected: the expert-parallel degree does not divide the GPUs
            row(gpus=3, nodes=2, batch=6),  # rejected: the nodes do not divide the GPUs
            row(gpu="L40S", gpus=1, batch=8),  # failed at runtime (breaks no rule)
            row(gpu="L40S", gpus=1, batch=16),  # failed at runtime
            row(gpu="L40S", tps=700, gpus=1, batch=16, model="granite-3.1-2b"),  # valid
        ],
    )
    assert numbers["rejections_by_rule"] == {
        "batch_size_not_multiple_of_gpus": 1,
        "gpus_not_multiple_of_expert_parallel_degree": 1,
        "gpus_not_multiple_of_nodes": 1,
    }
    sxm, l40s = numbers["table1"][SXM], numbers["table1"]["L40S"]
    assert list(numbers["table1"]) == [SXM, "L40S"]  # keys are the gpu_model values of the file
    assert (sxm["experiments"], sxm["valid"], sxm["rejected"], sxm["runtime"]) == (5, 2, 3, 0)
    assert (sxm["valid_pct"], sxm["rejected_pct"], sxm["runtime_pct"]) == pytest.approx((40.0, 60.0, 0.0))
    assert (sxm["gpus"], sxm["nodes"], sxm["llms"]) == ([1, 3], [1, 2], 1)
    assert (l40s["experiments"], l40s["valid_pct"], l40s["runtime_pct"]) == (
        3,
        pytest.approx(100 / 3),
        pytest.approx(200 / 3),
    )
    assert l40s["llms"] == 2
    by_batch = numbers["failure_by_batch_size"]
    assert list(by_batch) == ["3", "4", "6", "8", "16"]
    assert by_batch["8"] == {
        "runs": 3, "valid": 2, "rejected": 0, "runtime": 1, "failing": 1,
        "failure_pct": pytest.approx(100 / 3), "rejected_pct": 0.0, "runtime_pct": pytest.approx(100 / 3),
    }  # fmt: skip
    assert by_batch["16"]["failure_pct"] == pytest.approx(50.0)
    assert by_batch["3"]["rejected"] == by_batch["4"]["rejected"] == by_batch["6"]["rejected"] == 1
    assert numbers["outcomes"] == {
        "valid": 3, "rejected": 3, "runtime": 2, "experiments": 8, "no_valid_run": 5,
        "no_valid_run_pct": pytest.approx(62.5),
    }  # fmt: skip
    assert numbers["failure_pct_batch_16_to_64_pooled"] == pytest.approx(50.0)


def test_fast_kernel_speedup_is_the_median_over_matched_pairs(tmp_path: Path) -> None:
    protocol = "SFTTrainer.finetune_full_benchmark-v1.0.0-fms_hf_tuning_version.3.1.0-num_train_epochs.10"
    common = {"experiment": protocol, "version": "3.1.0"}
    numbers = numbers_of(
        tmp_path,
        [
            # Pair 1: two runs without fast kernels (median 200) against one with them: 250 / 200 = 1.25.
            row(tps=100, model="granite-3.1-2b", **common),
            row(tps=300, model="granite-3.1-2b", **common),
            row(tps=250, model="granite-3.1-2b", fast_kernels=True, **common),
            # Pair 2: 1500 / 1000 = 1.5.
            row(tps=1000, model="llama3.2-3b", **common),
            row(tps=1500, model="llama3.2-3b", fast_kernels=True, **common),
            # Not pairs: another dataset (an identifier-only setting), another protocol, a run that failed.
            row(tps=1000, model="llama3.1-8b", identifier_extra="-dataset_id.a", **common),
            row(tps=3000, model="llama3.1-8b", identifier_extra="-dataset_id.b", fast_kernels=True, **common),
            row(tps=1000, model="granite-3-8b", **common),
            row(
                tps=5000,
                model="granite-3-8b",
                fast_kernels=True,
                experiment=protocol + "-optim.sgd",
                version="3.1.0",
            ),
            row(tps=1000, model="llama3-8b", **common),
            row(model="llama3-8b", fast_kernels=True, **common),
        ],
    )
    kernels = numbers["fast_kernels"]
    # Two pairs, 1.25 and 1.5: median 1.375, quartiles by linear interpolation 1.3125 and 1.4375.
    assert kernels["pairs"] == 2
    assert kernels["median"] == pytest.approx(1.375)
    assert (kernels["q25"], kernels["q75"], kernels["iqr"]) == pytest.approx((1.3125, 1.4375, 0.125))
    assert kernels["gpu_hours_saved_pct"] == pytest.approx(100 * (1 - 1 / 1.375))
    assert kernels["models"] == ["granite-3.1-2b", "llama3.2-3b"]
    assert kernels["models_max_params_billion"] == pytest.approx(3.2)


def scaling_rows() -> list[dict[str, str]]:
    """Two campaigns that ran multi-node jobs with and without RoCE; scenarios apart by sequence length."""
    return [
        # 1 -> 2 GPUs at 4 samples per GPU: 1900 / (2 x 1000) = 0.95.
        row(tps=1000, gpus=1, batch=4, tokens=512),
        row(tps=1900, gpus=2, batch=8, tokens=512),
        # Memory-starved: the 1-GPU run peaked at 99.5 % of GPU memory, so 2000 / (2 x 500) = 2.0 is left out.
        row(tps=500, gpus=1, batch=4, tokens=1024, peak=99.5),
        row(tps=2000, gpus=2, batch=8, tokens=1024),
        # 8 -> 16 GPUs (1 -> 2 nodes) at 8 samples per GPU. The one-node run names hybrid sharding, which on
        # one node is full sharding, the two-node runs' default: 12000 / 16000 = 0.75 without RoCE, 0.95 with.
        row(tps=8000, gpus=8, batch=64, tokens=2048, identifier_extra="-fsdp_sharding_strategy.HYBRID_SHARD"),
        row(tps=12000, gpus=16, nodes=2, batch=128, tokens=2048, roce=0),
        row(tps=15200, gpus=16, nodes=2, batch=128, tokens=2048, roce=1),
        # Strong scaling: the same total batch of 8 on 1 and 2 GPUs: 1600 / (2 x 1000) = 0.8.
        row(tps=1000, gpus=1, batch=8, tokens=4096),
        row(tps=1600, gpus=2, batch=8, tokens=4096),
        # 16 -> 32 GPUs with RoCE only: no run without RoCE to compare with, so left out.
        row(tps=10000, gpus=16, nodes=2, batch=128, tokens=8192, roce=1),
        row(tps=19000, gpus=32, nodes=4, batch=256, tokens=8192, roce=1),
        # The 600 s campaign: 8 -> 16 GPUs, 4000 / 16000 = 0.25 without RoCE, 11200 / 16000 = 0.70 with.
        row(tps=8000, gpus=8, batch=8, experiment=CAPPED, version="2.7.1"),
        row(tps=4000, gpus=16, nodes=2, batch=16, roce=0, experiment=CAPPED, version="2.7.1"),
        row(tps=11200, gpus=16, nodes=2, batch=16, roce=1, experiment=CAPPED, version="2.7.1"),
        # Another experiment that never ran multi-node: not a campaign, so not in the per-campaign scaling.
        row(tps=1000, gpus=1, batch=4, experiment=UNCAPPED + "-optim.sgd"),
        row(tps=1200, gpus=2, batch=8, experiment=UNCAPPED + "-optim.sgd"),
    ]


def test_weak_scaling_per_campaign_and_network_leaves_memory_starved_pairs_out(tmp_path: Path) -> None:
    weak = numbers_of(tmp_path, scaling_rows())["weak_scaling"]
    assert set(weak["campaigns"]) == {"no time limit", "600 s cap"}
    assert weak["campaigns"]["600 s cap"] == [CAPPED]
    per = weak["per_doubling"]
    assert list(per) == ["1->2", "8->16"]
    assert per["1->2"]["placement"] == "intra-node"
    assert per["1->2"]["by_campaign"]["no time limit"]["pairs"] == 1
    assert per["1->2"]["by_campaign"]["no time limit"]["median"] == pytest.approx(0.95)
    assert weak["intra_node_efficiency_range"] == pytest.approx([0.95, 0.95])
    across = per["8->16"]["by_campaign"]
    assert per["8->16"]["placement"] == "across nodes"
    assert across["no time limit"]["without RoCE"]["median"] == pytest.approx(0.75)
    assert across["no time limit"]["with RoCE"]["median"] == pytest.approx(0.95)
    assert across["no time limit"]["with RoCE"]["gain_median"] == pytest.approx(1.9)
    assert across["600 s cap"]["without RoCE"]["median"] == pytest.approx(0.25)
    assert across["600 s cap"]["with RoCE"]["median"] == pytest.approx(0.70)
    assert weak["pairs_left_out_memory_starved"] == 1
    assert weak["pairs_left_out_one_network_only"] == 1
    assert weak["pairs"] == 5
    # Every experiment, not only the campaigns: 0.95 and 1200 / 2000 = 0.6; the starved pair stays out.
    everything = weak["intra_node_all_experiments"]["1->2"]
    assert (everything["pairs"], everything["median"]) == (2, pytest.approx(0.775))


def test_strong_scaling_and_roce_speedup_per_campaign(tmp_path: Path) -> None:
    numbers = numbers_of(tmp_path, scaling_rows())
    strong = numbers["strong_scaling"]["per_doubling"]
    assert list(strong) == ["1->2"]
    assert strong["1->2"]["by_campaign"]["no time limit"]["median"] == pytest.approx(0.8)
    roce = numbers["roce"]
    # RoCE pairs: 15200 / 12000 without a time limit, 11200 / 4000 capped; the 8192-token run has no partner.
    assert roce["by_campaign"]["no time limit"]["median"] == pytest.approx(15200 / 12000)
    assert roce["by_campaign"]["600 s cap"]["median"] == pytest.approx(2.8)
    assert roce["all"]["pairs"] == 2
    assert roce["all"]["median"] == pytest.approx((15200 / 12000 + 2.8) / 2)
    assert roce["by_campaign"]["600 s cap"]["gpu_hours_saved_pct"] == pytest.approx(100 * (1 - 1 / 2.8))


def test_gpu_types_fast_moe_and_methods_on_matched_pairs(tmp_path: Path) -> None:
    lora = "SFTTrainer.finetune_lora_benchmark-v1.0.0-fms_hf_tuning_version.2.4.0"
    numbers = numbers_of(
        tmp_path,
        [
            row(tps=1000, gpu=PCIE),
            row(tps=680, gpu="L40S"),
            row(tps=1180, gpu=SXM),
            row(tps=400, model="granite-4.0-h-tiny", fast_moe=0),
            row(tps=1000, model="granite-4.0-h-tiny", fast_moe=1),
            row(tps=300, model="granite-4.0-h-tiny", fast_moe=2, gpus=2),  # no EP-off run on 2 GPUs: no pair
            row(tps=1090, method="lora", experiment=lora),  # the same job as the first SXM run, with LoRA
        ],
    )
    comparisons = numbers["gpu_model_pairs"]["comparisons"]
    assert comparisons["L40S vs A100-PCIe"]["median"] == pytest.approx(0.68)
    assert comparisons["A100-SXM vs A100-PCIe"]["median"] == pytest.approx(1.18)
    assert comparisons["L40S vs A100-PCIe"]["slower_pairs"] == 1
    moe = numbers["fast_moe"]
    assert list(moe["by_expert_parallel_degree"]) == ["1"]
    assert moe["by_method_and_expert_parallel_degree"]["full"]["1"]["median"] == pytest.approx(2.5)
    assert numbers["lora_vs_full"]["pairs"] == 1
    assert numbers["lora_vs_full"]["median"] == pytest.approx(1090 / 1180)
