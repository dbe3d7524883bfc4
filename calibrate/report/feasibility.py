"""Q1, will the job run? Outcomes per GPU type (the paper's Table 1), failure ratios per factor split into
rejected before launch and failed at runtime (Figure 2), and rejections per admission rule.

Every percentage is a share of the experiments in its row, so rejected_pct + runtime_pct = failure_pct.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from calibrate.loader import outcome_counts, rule_counts
from calibrate.report.stats import key_str, largest_remainder_pct, pct
from twin.domain import GPU_TYPES, Outcome

FAILURE_FACTORS = ("batch_size", "tokens_per_sample", "gpu_model", "method")


def feasibility(table: pd.DataFrame) -> dict[str, Any]:
    counts = outcome_counts(table)
    failing = counts[Outcome.REJECTED.value] + counts[Outcome.RUNTIME.value]
    numbers: dict[str, Any] = {
        "outcomes": {
            **counts,
            "experiments": len(table),
            "no_valid_run": failing,
            "no_valid_run_pct": pct(failing, len(table)),
        },
        "table1": {gpu: _table1_row(rows) for gpu, rows in _by_gpu(table)},
        "table1_dataset": _table1_row(table) if len(table) else None,
        "rejections_by_rule": rule_counts(table),
    }
    for factor in FAILURE_FACTORS:
        numbers[f"failure_by_{factor}"] = failure_breakdown(table, factor)
    # The paper's "52 % for small batch sizes (16-64)": all experiments at those batches, pooled.
    mid = table[table["batch_size"].between(16, 64)]
    numbers["failure_pct_batch_16_to_64_pooled"] = pct(
        int((mid["outcome"] != Outcome.VALID.value).sum()), len(mid)
    )
    return numbers


def gpu_order(names: pd.Series | list[str]) -> list[str]:
    """GPU types in the paper's order (A100-SXM, A100-PCIe, L40S, H100-PCIe), unknown ones after, by name."""
    known = list(GPU_TYPES)
    present = sorted(set(names), key=lambda g: (known.index(g) if g in known else len(known), g))
    return present


def _by_gpu(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [(gpu, table[table["gpu_model"] == gpu]) for gpu in gpu_order(table["gpu_model"])]


def _table1_row(rows: pd.DataFrame) -> dict[str, Any]:
    counts = outcome_counts(rows)
    n = len(rows)
    gpu = rows["gpu_model"].iloc[0] if rows["gpu_model"].nunique() == 1 else None
    known = GPU_TYPES.get(gpu) if gpu else None
    return {
        "short_name": known.short if known else gpu,
        "memory_gb": known.memory_gb if known else None,
        "experiments": n,
        "valid": counts[Outcome.VALID.value],
        "rejected": counts[Outcome.REJECTED.value],
        "runtime": counts[Outcome.RUNTIME.value],
        "valid_pct": pct(counts[Outcome.VALID.value], n),
        "rejected_pct": pct(counts[Outcome.REJECTED.value], n),
        "runtime_pct": pct(counts[Outcome.RUNTIME.value], n),
        # What Table 1 prints: one decimal, rounded by largest remainder so the row sums to exactly 100.0.
        "pct_rounded": _rounded_shares(counts),
        "llms": int(rows["model_name"].nunique()),
        "gpus": [int(rows["number_gpus"].min()), int(rows["number_gpus"].max())],
        "nodes": [int(rows["number_nodes"].min()), int(rows["number_nodes"].max())],
    }


def _rounded_shares(counts: dict[str, int]) -> dict[str, float] | None:
    order = (Outcome.VALID.value, Outcome.REJECTED.value, Outcome.RUNTIME.value)
    shares = largest_remainder_pct([counts[o] for o in order], decimals=1)
    return None if shares is None else dict(zip(order, shares, strict=True))


def failure_breakdown(table: pd.DataFrame, factor: str) -> dict[str, dict[str, Any]]:
    """Per value of `factor`: runs, outcomes, failing runs and their share (numeric values in order)."""
    if table.empty:
        return {}
    counts = table.groupby([factor, "outcome"]).size().unstack(fill_value=0)
    if factor == "gpu_model":
        counts = counts.reindex(gpu_order(list(counts.index)))
    rows: dict[str, dict[str, Any]] = {}
    for value, row in counts.iterrows():
        valid = int(row.get(Outcome.VALID.value, 0))
        rejected = int(row.get(Outcome.REJECTED.value, 0))
        runtime = int(row.get(Outcome.RUNTIME.value, 0))
        runs = valid + rejected + runtime
        rows[key_str(value)] = {
            "runs": runs,
            "valid": valid,
            "rejected": rejected,
            "runtime": runtime,
            "failing": rejected + runtime,
            "failure_pct": pct(rejected + runtime, runs),
            "rejected_pct": pct(rejected, runs),
            "runtime_pct": pct(runtime, runs),
        }
    return rows
