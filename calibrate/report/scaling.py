"""Q3, will it scale? Median throughput by GPU count per method (Figure 5), weak-scaling efficiency per
doubling on matched pairs, strong scaling at equal total batch, and LoRA against full fine-tuning.

Efficiency of a g → 2g pair = throughput(2g) / (2 × throughput(g)); 1 means doubling the GPUs doubles
the throughput. Both runs use the fewest 8-GPU nodes (1 node up to 8 GPUs). RoCE only exists between
nodes: a single-node run pairs with a multi-node run with or without RoCE, and the pair is classed by the
larger run's setting; two multi-node runs must agree on RoCE. Across nodes, runs without and with RoCE are
compared on the configurations both ran.

Like the paper, scaling is measured on the campaigns that ran multi-node jobs both with and without RoCE
(in LLMFineTuningBench: fms-hf-tuning 2.4.0 without a time limit and 2.7.1 capped at 600 s), one campaign
at a time, because the campaigns disagree across nodes. Intra-node doublings over every experiment are
reported beside them, so a file without such campaigns (e.g. single-node GPUs only) still answers them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from calibrate.report.pairs import GPU_COUNT, METHOD, pair_up, settings_table
from calibrate.report.stats import THROUGHPUT, campaign_label, ratio_summary
from calibrate.report.throughput import valid_runs
from twin.domain import GPUS_PER_NODE, METHODS, model_params_b

# A run whose GPU memory peaked this high was starved for memory; it speeds up once its memory doubles, which
# is not scaling. Pairs whose smaller run peaked here (or has no memory telemetry, so cannot be cleared) are
# left out, at equal batch per GPU as the paper does and, for the same reason, at equal total batch.
MEMORY_STARVED_PCT = 99.0
WEAK = "weak"
STRONG = "strong"
WITH_ROCE, WITHOUT_ROCE = "with RoCE", "without RoCE"


def scaling(table: pd.DataFrame) -> dict[str, Any]:
    by_count = throughput_by_gpu_count(table)
    return {
        "throughput_by_gpu_count": by_count,
        "median_tokens_per_s_1_gpu_range": _range_at(by_count, "1"),
        "median_tokens_per_s_8_gpu_range": _range_at(by_count, "8"),
        "weak_scaling": scaling_efficiency(table, WEAK),
        "strong_scaling": scaling_efficiency(table, STRONG),
        "lora_vs_full": lora_vs_full(table),
        "median_params_billion_above_8_gpus": _median_params_above_one_node(table),
    }


def throughput_by_gpu_count(table: pd.DataFrame) -> dict[str, dict[str, Any]]:
    valid = valid_runs(table)
    out: dict[str, dict[str, Any]] = {}
    for method in [m for m in METHODS if m in set(valid["method"])]:
        runs = valid[valid["method"] == method]
        out[method] = {
            str(int(g)): {
                "median": float(group[THROUGHPUT].median()),
                "runs": len(group),
                "nodes": sorted(int(n) for n in group["number_nodes"].unique()),
            }
            for g, group in runs.groupby("number_gpus")
        }
    return out


def _range_at(by_count: dict[str, dict[str, Any]], gpus: str) -> list[float] | None:
    medians = [cells[gpus]["median"] for cells in by_count.values() if gpus in cells]
    return [min(medians), max(medians)] if medians else None


def roce_campaigns(table: pd.DataFrame) -> dict[str, list[str]]:
    """Campaign (time-limit class) → its experiment_ids that ran multi-node jobs with and without RoCE."""
    multi = table[table["number_nodes"] > 1]
    settings = multi.groupby("experiment_id")["enable_roce"].nunique()
    both = settings[settings == 2].index
    limits = table[table["experiment_id"].isin(both)].groupby("experiment_id")["time_limit_s"].first()
    campaigns: dict[str, list[str]] = {}
    for experiment, limit in sorted(limits.items()):
        campaigns.setdefault(campaign_label(limit), []).append(experiment)
    return campaigns


def scaling_pairs(table: pd.DataFrame, kind: str) -> pd.DataFrame:
    """g → 2g pairs on the fewest nodes; weak keeps the batch per GPU, strong keeps the total batch.
    Adds `efficiency`, `memory` (ok | starved | unknown for the g-GPU run), `campaign`, `roce`, `doubling`."""
    settings = settings_table(table, GPU_COUNT)
    fewest_nodes = settings["number_nodes"] == -(-settings["number_gpus"] // GPUS_PER_NODE)

    def doubling(p: pd.DataFrame) -> pd.Series:
        same_batch = (
            p["batch_size_b"] * p["number_gpus_a"] == p["batch_size_a"] * p["number_gpus_b"]
            if kind == WEAK
            else p["batch_size_b"] == p["batch_size_a"]
        )
        roce_comparable = (p["number_nodes_a"] == 1) | (p["enable_roce_a"] == p["enable_roce_b"])
        return (p["number_gpus_b"] == 2 * p["number_gpus_a"]) & same_batch & roce_comparable

    pairs = pair_up(settings, fewest_nodes, fewest_nodes, where=doubling)
    pairs["efficiency"] = pairs["ratio"] / 2.0
    peak = pairs["memory_peak_a"]
    pairs["memory"] = np.where(peak.isna(), "unknown", np.where(peak >= MEMORY_STARVED_PCT, "starved", "ok"))
    pairs["campaign"] = pairs["time_limit_s_a"].map(campaign_label)
    pairs["across_nodes"] = pairs["number_nodes_b"] > 1
    roce_on = pairs["enable_roce_b"].astype(bool)
    pairs["roce"] = np.where(pairs["across_nodes"], np.where(roce_on, WITH_ROCE, WITHOUT_ROCE), "n/a")
    pairs["doubling"] = [
        f"{int(a)}->{int(b)}" for a, b in zip(pairs["number_gpus_a"], pairs["number_gpus_b"], strict=True)
    ]
    return pairs


def _both_networks(pairs: pd.DataFrame) -> pd.DataFrame:
    """Across nodes, only the configurations that ran both without and with RoCE (same job, two networks)."""
    across = pairs[pairs["across_nodes"]]
    identity = ["campaign", "doubling", "key", "number_gpus_a", "batch_size_a"]
    networks = across.groupby(identity)["roce"].transform("nunique")
    return pd.concat([pairs[~pairs["across_nodes"]], across[networks == 2]])


def scaling_efficiency(table: pd.DataFrame, kind: str) -> dict[str, Any]:
    campaigns = roce_campaigns(table)
    in_campaigns = table["experiment_id"].isin([e for ids in campaigns.values() for e in ids])
    pairs = scaling_pairs(table[in_campaigns], kind)
    cleared = pairs[pairs["memory"] == "ok"]
    used = _both_networks(cleared)
    per_doubling: dict[str, Any] = {}
    for doubling, group in sorted(used.groupby("doubling"), key=lambda item: int(item[0].split("->")[0])):
        across = bool(group["across_nodes"].iloc[0])
        by_campaign: dict[str, Any] = {}
        for campaign, in_campaign in group.groupby("campaign"):
            if across:
                by_campaign[campaign] = {r: _efficiency(g) for r, g in in_campaign.groupby("roce")}
            else:
                by_campaign[campaign] = _efficiency(in_campaign)
        per_doubling[doubling] = {
            "placement": "across nodes" if across else "intra-node",
            "by_campaign": by_campaign,
        }
    intra = [
        s["median"]
        for e in per_doubling.values()
        if e["placement"] == "intra-node"
        for s in e["by_campaign"].values()
    ]
    everything = scaling_pairs(table, kind)
    everything = everything[(everything["memory"] == "ok") & ~everything["across_nodes"]]
    return {
        "definition": (
            "efficiency = throughput(2g) / (2 x throughput(g)) over matched pairs at equal "
            + ("batch per GPU" if kind == WEAK else "total batch")
            + ", both runs on the fewest 8-GPU nodes, per campaign; gain = 2 x efficiency. per_doubling: "
            "intra-node -> by_campaign[campaign]; across nodes -> by_campaign[campaign][with/without RoCE]"
        ),
        "campaigns": campaigns,
        "pairs": len(used),
        "memory_starved_threshold_pct": MEMORY_STARVED_PCT,
        "pairs_left_out_memory_starved": int((pairs["memory"] == "starved").sum()),
        "pairs_left_out_no_memory_telemetry": int((pairs["memory"] == "unknown").sum()),
        "pairs_left_out_one_network_only": len(cleared) - len(used),
        "per_doubling": per_doubling,
        "intra_node_efficiency_range": [min(intra), max(intra)] if intra else None,
        "intra_node_all_experiments": {
            d: _efficiency(g)
            for d, g in sorted(everything.groupby("doubling"), key=lambda item: int(item[0].split("->")[0]))
        },
    }


def _efficiency(group: pd.DataFrame) -> dict[str, Any]:
    summary = ratio_summary(group["efficiency"])
    summary["gain_median"] = None if summary["median"] is None else 2.0 * summary["median"]
    return summary


def lora_vs_full(table: pd.DataFrame) -> dict[str, Any]:
    """The same job run with LoRA and with full fine-tuning: ratio = throughput(LoRA) / throughput(full)."""
    settings = settings_table(table, METHOD)
    pairs = pair_up(settings, settings["method"] == "full", settings["method"] == "lora")
    return ratio_summary(pairs["ratio"])


def _median_params_above_one_node(table: pd.DataFrame) -> dict[str, float | None]:
    valid = valid_runs(table)
    above = valid[valid["number_gpus"] > GPUS_PER_NODE]
    params = above["model_name"].map(model_params_b)
    return {m: float(params[above["method"] == m].median()) for m in METHODS if (above["method"] == m).any()}
