"""Figure 5 (median throughput by GPU count per method) and Figure 5b (scaling efficiency per doubling on
matched pairs)."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from calibrate.report.figures.style import (
    THIN,
    arrow,
    count_strip,
    interval_bars,
    right_edge,
    thin_legend_handles,
)
from twin.domain import GPUS_PER_NODE

_MULTI_NODE_SHADE = "#ececec"


def scaling_figure(numbers: dict[str, Any]) -> Figure | None:
    by_count = numbers["throughput_by_gpu_count"]
    if not by_count:
        return None
    strip_height = 0.28 * len(by_count) + 0.5
    figure = Figure(figsize=(10, 5.4 + strip_height), layout="constrained")
    ax, strip = figure.subplots(2, 1, sharex=True, height_ratios=[4.6, strip_height])
    counts = []
    largest = 1
    for i, (method, cells) in enumerate(by_count.items()):
        color = f"C{i}"
        gpus = np.array([int(g) for g in cells])
        medians = np.array([c["median"] for c in cells.values()])
        multi_node = np.array([max(c["nodes"]) > 1 for c in cells.values()])
        thin = np.array([c["runs"] < THIN for c in cells.values()])
        ax.plot(gpus, medians, color=color, alpha=0.6, linewidth=1.2)
        # Shape: one node (circle) or several (square); fill: solid, or hollow when few runs make the median.
        for marker, where_nodes in (("o", ~multi_node), ("s", multi_node)):
            for face, where_runs in ((color, ~thin), ("white", thin)):
                chosen = where_nodes & where_runs
                ax.plot(gpus[chosen], medians[chosen], marker, color=color, markerfacecolor=face)
        counts.append((method, color, {int(g): c["runs"] for g, c in cells.items()}))
        largest = max(largest, int(gpus.max()))
    ax.set_xscale("log", base=2)
    left = min(int(g) for cells in by_count.values() for g in cells)
    ax.set_xlim(left / 2**0.5, largest * 2**0.5)
    if largest > GPUS_PER_NODE:
        # The node boundary as a shaded region rather than a text in the plot, which collided with the counts.
        boundary = GPUS_PER_NODE * 2**0.5  # halfway between 8 and 16 GPUs on the log2 axis
        for axis in (ax, strip):
            axis.axvspan(boundary, largest * 2**0.5, color=_MULTI_NODE_SHADE, zorder=0, linewidth=0)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.set_ylabel("median throughput [tokens/s]")
    ax.tick_params(axis="x", labelbottom=False)
    count_strip(strip, counts, f"valid runs per median (bold: fewer than {THIN})")
    strip.set_xlabel("number of GPUs [#] (log2)")
    handles: list[Any] = [Line2D([], [], color=f"C{i}", marker="o", label=m) for i, m in enumerate(by_count)]
    handles.append(
        Patch(
            facecolor=_MULTI_NODE_SHADE,
            edgecolor="gray",
            label=f"more than {GPUS_PER_NODE} GPUs: 2–4 nodes (squares)",
        )
    )
    handles.append(
        Line2D(
            [],
            [],
            color="gray",
            marker="o",
            markerfacecolor="white",
            linestyle="none",
            label=f"hollow: fewer than {THIN} runs",
        )
    )
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    figure.suptitle(
        f"Throughput by GPU count per fine-tuning method (valid runs; 1 node = {GPUS_PER_NODE} GPUs)"
    )
    return figure


def efficiency_rows(block: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(label, summary, note) per doubling, campaign and, across nodes, network."""
    rows: list[tuple[str, dict[str, Any], str]] = []
    for doubling, entry in block["per_doubling"].items():
        for campaign, value in entry["by_campaign"].items():
            if entry["placement"] == "intra-node":
                rows.append((f"{arrow(doubling)} GPUs, intra-node, {campaign}", value, ""))
            else:
                rows += [(f"{arrow(doubling)} GPUs, {campaign}, {roce}", s, "") for roce, s in value.items()]
    return rows


def efficiency_figure(numbers: dict[str, Any]) -> Figure | None:
    panels = []
    for kind in ("weak_scaling", "strong_scaling"):
        rows = efficiency_rows(numbers[kind])
        if any(s["pairs"] for _, s, _ in rows):
            panels.append((kind, rows))
    if not panels:
        return None
    heights = [len(rows) for _, rows in panels]
    figure = Figure(figsize=(11, 0.42 * sum(heights) + 2.6), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False, sharex=True, height_ratios=heights)[:, 0]
    right = right_edge([s for _, rows in panels for _, s, _ in rows], 1.0)
    for ax, (kind, rows) in zip(axes, panels, strict=True):
        interval_bars(ax, rows, "", 1.0)
        ax.set_xlim(0, right)
        ax.tick_params(axis="x", labelbottom=True)
        batch = "equal batch per GPU" if kind == "weak_scaling" else "equal total batch"
        ax.set_title(
            f"{kind.replace('_', ' ')} ({batch}, {numbers[kind]['pairs']} matched pairs)", fontsize=10
        )
    axes[-1].set_xlabel("efficiency = throughput(2g) / (2 × throughput(g)) [ratio]; whiskers: middle 50%")
    figure.legend(handles=thin_legend_handles(), loc="outside lower center", ncols=2)
    figure.suptitle("Scaling efficiency per GPU doubling on matched pairs, per campaign (1 = linear)")
    return figure
