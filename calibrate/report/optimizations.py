"""Q4, how to go faster? Speedups of RoCE, fast MoE and fast kernels over matched pairs (Figure 6):
speedup = throughput(on) / throughput(off); median, pair count, interquartile range and the GPU-hours
saved at the median speedup (1 − 1/speedup)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from calibrate.report.pairs import FAST_KERNELS, FAST_MOE, ROCE, pair_up, settings_table
from calibrate.report.stats import campaign_label, key_str, ratio_summary
from twin.domain import METHODS, Outcome, model_params_b


def optimizations(table: pd.DataFrame) -> dict[str, Any]:
    return {"roce": roce(table), "fast_moe": fast_moe(table), "fast_kernels": fast_kernels(table)}


def roce(table: pd.DataFrame) -> dict[str, Any]:
    """RoCE on vs off for the same multi-node job (it carries traffic between nodes only)."""
    settings = settings_table(table, ROCE)
    multi_node = settings["number_nodes"] > 1
    on = settings["enable_roce"].astype(bool)
    pairs = pair_up(settings, multi_node & ~on, multi_node & on)
    pairs["campaign"] = pairs["time_limit_s_a"].map(campaign_label)
    four_nodes = pairs[pairs["number_nodes_a"] == 4]
    return {
        "all": ratio_summary(pairs["ratio"], speedup=True),
        "by_campaign": {c: ratio_summary(g["ratio"], speedup=True) for c, g in pairs.groupby("campaign")},
        "by_campaign_and_nodes": {
            c: {key_str(n): ratio_summary(gn["ratio"], speedup=True) for n, gn in g.groupby("number_nodes_a")}
            for c, g in pairs.groupby("campaign")
        },
        # On 4 nodes the campaign-wide median hides models that gain and models that do not.
        "per_model_4_nodes": {
            c: {m: ratio_summary(gm["ratio"], speedup=True) for m, gm in g.groupby("model_name_a")}
            for c, g in four_nodes.groupby("campaign")
        },
    }


def fast_moe(table: pd.DataFrame) -> dict[str, Any]:
    """Fast MoE at expert-parallel degree k vs off (fast_moe 0) for the same job, per degree and method."""
    settings = settings_table(table, FAST_MOE)
    off = settings["fast_moe"] == 0
    by_ep: dict[str, Any] = {}
    by_method: dict[str, dict[str, Any]] = {}
    for ep in sorted(int(e) for e in settings["fast_moe"].unique() if e > 0):
        pairs = pair_up(settings, off, settings["fast_moe"] == ep)
        if pairs.empty:
            continue
        by_ep[str(ep)] = ratio_summary(pairs["ratio"], speedup=True)
        for method, group in pairs.groupby("method_a"):
            by_method.setdefault(method, {})[str(ep)] = ratio_summary(group["ratio"], speedup=True)
    spread = [s["median"] for ep, s in by_ep.items() if ep != "1"]
    return {
        "by_expert_parallel_degree": by_ep,
        "by_method_and_expert_parallel_degree": {m: by_method[m] for m in METHODS if m in by_method},
        "speedup_ep_gt1_range": [min(spread), max(spread)] if spread else None,
        "degrees_without_valid_run": degrees_without_valid_run(table),
    }


def degrees_without_valid_run(table: pd.DataFrame) -> dict[str, int]:
    """Expert-parallel degree → experiments tried at it, for the degrees that never produced a valid run
    (they have no pair, so the speedup table alone would not show they were tried)."""
    tried = table[table["fast_moe"] > 0]
    ran = set(tried.loc[tried["outcome"] == Outcome.VALID.value, "fast_moe"])
    counts = tried["fast_moe"].value_counts()
    return {str(int(ep)): int(counts[ep]) for ep in sorted(counts.index) if ep not in ran}


def fast_kernels(table: pd.DataFrame) -> dict[str, Any]:
    settings = settings_table(table, FAST_KERNELS)
    pairs = pair_up(settings, ~settings["fast_kernels"].astype(bool), settings["fast_kernels"].astype(bool))
    models = sorted(set(pairs["model_name_a"]))
    sizes = [p for p in map(model_params_b, models) if p is not None]
    ratios = pairs["ratio"]
    return {
        **ratio_summary(ratios, speedup=True),
        # The median says how much a typical pair gains; this says how many gain at all.
        "share_faster": float((ratios > 1).mean()) if len(ratios) else None,
        "models": models,
        "models_max_params_billion": max(sizes) if sizes else None,
    }
