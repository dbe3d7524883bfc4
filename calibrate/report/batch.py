"""Q2, batch size on matched pairs: what one doubling of the batch buys on one GPU.

Figure 3's medians per batch size compare different runs at each batch: the mix of models and sequence
lengths that ran changes from one batch size to the next (large models only run at small batches, long
sequences fail at large ones), so two medians can move apart for reasons that have nothing to do with the
batch. A matched pair holds everything else fixed: the same configuration on one GPU at batch b and at 2b.
The ratio per doubling is the median over such pairs, and it is the number to believe when the two disagree.

The least-squares fit of Figure 3's medians on log2(batch) stays beside it: it is what "throughput grows
logarithmically with the batch size" rests on, and its R² says how well a straight line in log2(batch) fits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from calibrate.report.feasibility import gpu_order
from calibrate.report.pairs import Factor, pair_up, settings_table
from calibrate.report.stats import THROUGHPUT
from calibrate.report.throughput import valid_runs

BATCH_SIZE = Factor("batch_size", ("batch_size",), ("batch_size",))


def batch_doubling(table: pd.DataFrame) -> dict[str, Any]:
    """Per GPU type with valid single-GPU runs: matched ratio per doubling and the log2 fit of the medians.

    `doublings[i]` ("b->2b"), `ratios[i]` (median of throughput(2b) / throughput(b) over the pairs),
    `pairs[i]`, `q25[i]` and `q75[i]` describe one doubling with at least one pair, in batch order."""
    one_gpu = table[table["number_gpus"] == 1]
    valid = valid_runs(one_gpu)
    out: dict[str, Any] = {}
    for gpu in gpu_order(valid["gpu_model"]):
        on_gpu = one_gpu[one_gpu["gpu_model"] == gpu]
        medians = valid[valid["gpu_model"] == gpu].groupby("batch_size")[THROUGHPUT].median().sort_index()
        out[gpu] = {**_matched_doublings(on_gpu), "log2_fit": log2_fit(medians)}
    return out


def _matched_doublings(table: pd.DataFrame) -> dict[str, list[Any]]:
    settings = settings_table(table, BATCH_SIZE)
    doublings: dict[str, list[Any]] = {"doublings": [], "ratios": [], "pairs": [], "q25": [], "q75": []}
    batches = sorted(int(b) for b in settings["batch_size"].unique())
    for batch in batches:
        if 2 * batch not in batches:
            continue
        pairs = pair_up(settings, settings["batch_size"] == batch, settings["batch_size"] == 2 * batch)
        if pairs.empty:
            continue
        q25, median, q75 = np.percentile(pairs["ratio"].to_numpy(dtype=float), [25, 50, 75])
        doublings["doublings"].append(f"{batch}->{2 * batch}")
        doublings["ratios"].append(float(median))
        doublings["pairs"].append(len(pairs))
        doublings["q25"].append(float(q25))
        doublings["q75"].append(float(q75))
    return doublings


def log2_fit(medians: pd.Series) -> dict[str, Any]:
    """Least squares of the medians on log2(batch): slope (tokens/s one doubling adds) and R² (None when
    fewer than two batch sizes, or when the medians do not vary, leave R² undefined)."""
    fit: dict[str, Any] = {"slope": None, "r2": None, "points": len(medians)}
    if len(medians) < 2:
        return fit
    x = np.log2(medians.index.to_numpy(dtype=float))
    y = medians.to_numpy(dtype=float)
    slope, _ = np.polyfit(x, y, 1)
    fit["slope"] = float(slope)
    if np.ptp(y) > 0:
        fit["r2"] = float(np.corrcoef(x, y)[0, 1] ** 2)
    return fit
