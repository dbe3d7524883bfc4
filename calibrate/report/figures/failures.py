"""Figure 2: failure ratios per factor, split into rejected before launch and failed at runtime."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure

from calibrate.report.figures.style import REJECTED_COLOR, RUNTIME_COLOR, short_gpu


def failures_figure(numbers: dict[str, Any]) -> Figure | None:
    if not numbers["outcomes"]["experiments"]:
        return None
    panels = [
        ("failure_by_batch_size", "(a) batch size [#]", False),
        ("failure_by_tokens_per_sample", "(b) tokens per sample [tokens]", False),
        ("failure_by_gpu_model", "(c) GPU model", True),
        ("failure_by_method", "(d) fine-tuning method", True),
    ]
    figure = Figure(figsize=(13, 7.5), layout="constrained")
    axes = figure.subplots(2, 2)
    for ax, (key, label, by_ratio) in zip(axes.flat, panels, strict=True):
        rows = numbers[key]
        names = list(rows)
        if by_ratio:
            names.sort(key=lambda n: rows[n]["failure_pct"])
        labels = [short_gpu(n) if key == "failure_by_gpu_model" else n for n in names]
        rejected = [rows[n]["rejected_pct"] for n in names]
        runtime = [rows[n]["runtime_pct"] for n in names]
        y = np.arange(len(names))
        ax.barh(
            y, rejected, color=REJECTED_COLOR, hatch="//", edgecolor="white", label="rejected before launch"
        )
        ax.barh(y, runtime, left=rejected, color=RUNTIME_COLOR, label="failed at runtime")
        for i, n in enumerate(names):
            row = rows[n]
            ax.text(
                min(row["failure_pct"], 100) + 1,
                i,
                f"{row['failure_pct']:.0f}% ({row['failing']:,} of {row['runs']:,})",
                va="center",
                fontsize=8,
            )
        ax.set_yticks(y, labels)
        ax.set_xlim(0, 130)
        ax.set_xlabel("failure ratio [% of experiments]")
        ax.set_ylabel(label)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=2)
    figure.suptitle(
        f"Failure ratios per factor (n = {numbers['outcomes']['experiments']:,} experiments, "
        f"{numbers['outcomes']['no_valid_run']:,} without a valid run)"
    )
    return figure
