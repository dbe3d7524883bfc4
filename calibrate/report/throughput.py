"""Q2, how fast? Median throughput by batch size per GPU type on single-GPU runs (Figure 3; one GPU so
adding GPUs does not blur the batch-size trend), median throughput per batch × tokens-per-sample cell
over all valid runs (Figure 4), and GPU types compared on matched pairs (each GPU type ran different
models, so only pairs isolate the GPU)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

from calibrate.report.feasibility import gpu_order
from calibrate.report.pairs import GPU_MODEL, pair_up, settings_table
from calibrate.report.stats import THROUGHPUT, key_str, ratio_summary
from twin.domain import GPU_TYPES, Outcome


def valid_runs(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["outcome"] == Outcome.VALID.value) & table[THROUGHPUT].notna()]


def throughput(table: pd.DataFrame) -> dict[str, Any]:
    return {
        "throughput_single_gpu": single_gpu(table),
        "throughput_grid": grid(table),
        "gpu_model_pairs": gpu_model_pairs(table),
    }


def single_gpu(table: pd.DataFrame) -> dict[str, Any]:
    single = valid_runs(table)
    single = single[single["number_gpus"] == 1]
    by_gpu: dict[str, Any] = {}
    for gpu in gpu_order(single["gpu_model"]):
        runs = single[single["gpu_model"] == gpu]
        stats = runs.groupby("batch_size")[THROUGHPUT].agg(["median", "size"]).sort_index()
        medians = stats["median"]
        by_gpu[gpu] = {
            "median_tokens_per_s_by_batch": {
                key_str(b): {"median": float(r["median"]), "runs": int(r["size"])}
                for b, r in stats.iterrows()
            },
            "gain_batch8_vs_1": _gain(medians, 8, 1),
            "gain_batch128_vs_8": _gain(medians, 128, 8),
            "largest_batch_that_ran": int(medians.index.max()),
            # Throughput grows with log2(batch): the least-squares slope is what one doubling adds.
            "tokens_per_s_added_per_batch_doubling": _slope_per_doubling(medians),
        }
    return {"valid_single_gpu_runs": len(single), "by_gpu_model": by_gpu}


def _gain(medians: pd.Series, to: int, frm: int) -> float | None:
    if to in medians.index and frm in medians.index:
        return float(medians[to] / medians[frm])
    return None


def _slope_per_doubling(medians: pd.Series) -> float | None:
    if len(medians) < 2:
        return None
    x = np.log2(medians.index.to_numpy(dtype=float))
    slope, _ = np.polyfit(x, medians.to_numpy(dtype=float), 1)
    return float(slope)


def grid(table: pd.DataFrame) -> dict[str, Any]:
    """Cells tested without a valid run are kept (`median` None): 'no valid run' is not 'not tested'."""
    valid = valid_runs(table)
    tested = table.groupby(["batch_size", "tokens_per_sample"]).size()
    cells = []
    for (batch, tokens), experiments in tested.items():
        runs = valid[(valid["batch_size"] == batch) & (valid["tokens_per_sample"] == tokens)]
        cells.append(
            {
                "batch_size": int(batch),
                "tokens_per_sample": int(tokens),
                "experiments": int(experiments),
                "valid_runs": len(runs),
                "median": float(runs[THROUGHPUT].median()) if len(runs) else None,
                "gpus": sorted(int(g) for g in runs["number_gpus"].unique()),
            }
        )
    ran = [c for c in cells if c["median"] is not None]
    return {
        "valid_runs": len(valid),
        "batch_sizes": sorted(int(b) for b in table["batch_size"].unique()),
        "tokens_per_sample": sorted(int(t) for t in table["tokens_per_sample"].unique()),
        "cells": cells,
        "min_median": min(ran, key=lambda c: c["median"]) if ran else None,
        "max_median": max(ran, key=lambda c: c["median"]) if ran else None,
    }


def gpu_model_pairs(table: pd.DataFrame) -> dict[str, Any]:
    """Every two GPU types with pairs: ratio = throughput(first named) / throughput(second named).

    The reference (denominator) is the earlier type in A100-PCIe, A100-SXM, L40S, H100-PCIe order, the
    way the paper puts it (L40S vs A100-PCIe, A100-SXM vs A100-PCIe)."""
    settings = settings_table(table, GPU_MODEL)
    reference_order = ["NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-SXM4-80GB", "L40S", "NVIDIA-H100-PCIe"]
    present = sorted(
        set(settings["gpu_model"]),
        key=lambda g: (reference_order.index(g) if g in reference_order else len(reference_order), g),
    )
    comparisons: dict[str, Any] = {}
    for reference, other in itertools.combinations(present, 2):
        pairs = pair_up(settings, settings["gpu_model"] == reference, settings["gpu_model"] == other)
        if pairs.empty:
            continue
        comparisons[f"{_short(other)} vs {_short(reference)}"] = {
            "numerator": other,
            "denominator": reference,
            **ratio_summary(pairs["ratio"]),
            "slower_pairs": int((pairs["ratio"] < 1).sum()),
        }
    return {"gpu_models_with_valid_runs": present, "comparisons": comparisons}


def _short(gpu: str) -> str:
    known = GPU_TYPES.get(gpu)
    return known.short if known else gpu
