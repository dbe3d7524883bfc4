"""What the data holds, before any question is asked of it: experiments as the dataset names them, the
range of model sizes, how much of it ran on one GPU type, and which GPU types never report power (so a
reader knows which energy figures cannot exist)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from calibrate.report.feasibility import gpu_order
from calibrate.report.stats import pct
from twin.domain import model_params_b

# The GPU type that carries most of LLMFineTuningBench (and its only multi-node runs): its share says how much
# of any pooled number is really an A100-SXM number.
A100_SXM = "NVIDIA-A100-SXM4-80GB"
# The power column the GPU types either have or lack as a whole (the other power columns come with it).
POWER = "gpu_power_watts_avg"


def inventory(table: pd.DataFrame) -> dict[str, Any]:
    models = sorted(set(table["model_name"]))
    sizes = {m: model_params_b(m) for m in models}
    known = {m: p for m, p in sizes.items() if p is not None}
    smallest = min(known, key=lambda m: (known[m], m)) if known else None
    largest = max(known, key=lambda m: (known[m], m)) if known else None
    power = table[POWER].notna() if POWER in table else pd.Series(False, index=table.index)
    with_power = set(table.loc[power, "gpu_model"])
    return {
        "experiments": len(table),
        "experiment_ids": int(table["experiment_id"].nunique()),
        "llms": len(models),
        "model_params_billion": {
            "min": known[smallest] if smallest else None,
            "max": known[largest] if largest else None,
            "smallest_model": smallest,
            "largest_model": largest,
        },
        "models_without_known_size": [m for m, p in sizes.items() if p is None],
        "a100_sxm_rows_pct": pct(int((table["gpu_model"] == A100_SXM).sum()), len(table)),
        "most_common_gpu": _most_common_gpu(table),
        "gpu_models_without_power_telemetry": [
            g for g in gpu_order(table["gpu_model"]) if g not in with_power
        ],
    }


def _most_common_gpu(table: pd.DataFrame) -> dict[str, Any] | None:
    """The GPU type with the most experiments (the first in the paper's order on a tie) and its share: the
    GPU type a pooled number mostly speaks of, when it holds more than half."""
    if not len(table):
        return None
    counts = table["gpu_model"].value_counts()
    top = max(gpu_order(table["gpu_model"]), key=lambda g: counts[g])
    return {"gpu_model": top, "rows_pct": pct(int(counts[top]), len(table))}
