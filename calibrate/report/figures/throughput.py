"""Figure 3 (throughput and batch size on one GPU) and Figure 4 (median per batch × sequence length).

Figure 3 has two panels because its two readings disagree. (a) is the paper's: the median throughput of
whatever ran at each batch size, a line through medians whose mix of models changes from one batch size to
the next. (b) holds the model fixed: the matched ratio of each batch doubling. Where (a) falls and (b) stays
above 1, the fall is the mix, not the batch; (b) is the one to believe.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from calibrate.report.figures.style import REFERENCE_STYLE, THIN, arrow, count_strip, fmt_tokens, short_gpu

_DODGE = 0.12  # how far apart the GPU types' points sit at one doubling in panel (b), in doublings


def single_gpu_figure(numbers: dict[str, Any]) -> Figure | None:
    single = numbers["throughput_single_gpu"]
    if not single["valid_single_gpu_runs"]:
        return None
    by_gpu = single["by_gpu_model"]
    doubling = numbers.get("batch_doubling", {})
    colors = {gpu: f"C{i}" for i, gpu in enumerate(by_gpu)}
    strip_height = 0.28 * len(by_gpu) + 0.5
    figure = Figure(figsize=(14, 5.2 + strip_height), layout="constrained")
    grid = figure.add_gridspec(2, 2, height_ratios=[4.6, strip_height])
    ax_a, ax_b = figure.add_subplot(grid[0, 0]), figure.add_subplot(grid[0, 1])
    strip_a = figure.add_subplot(grid[1, 0], sharex=ax_a)
    strip_b = figure.add_subplot(grid[1, 1], sharex=ax_b)
    _medians_panel(ax_a, strip_a, by_gpu, colors)
    _doublings_panel(ax_b, strip_b, doubling, colors)
    handles = [Line2D([], [], color=colors[g], marker="o", label=short_gpu(g)) for g in by_gpu]
    handles.append(
        Line2D(
            [],
            [],
            color="gray",
            marker="o",
            markerfacecolor="white",
            linestyle="none",
            label=f"hollow: median of fewer than {THIN} runs (a) or pairs (b)",
        )  # fmt: skip
    )
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles))
    figure.suptitle(
        f"Throughput and batch size on one GPU ({single['valid_single_gpu_runs']:,} valid runs): "
        "(a) mixes models that differ per batch size, (b) holds the job fixed; read (b)"
    )
    return figure


def _medians_panel(ax: Any, strip: Any, by_gpu: dict[str, Any], colors: dict[str, str]) -> None:
    counts = []
    for gpu, entry in by_gpu.items():
        cells = entry["median_tokens_per_s_by_batch"]
        batches = np.array([int(b) for b in cells])
        medians = np.array([c["median"] for c in cells.values()])
        runs = np.array([c["runs"] for c in cells.values()])
        color = colors[gpu]
        ax.plot(batches, medians, color=color, alpha=0.6, linewidth=1.2)
        solid = runs >= THIN
        ax.plot(batches[solid], medians[solid], "o", color=color)
        ax.plot(batches[~solid], medians[~solid], "o", color=color, markerfacecolor="white")
        counts.append((short_gpu(gpu), color, dict(zip(batches.tolist(), runs.tolist(), strict=True))))
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
    ax.set_ylabel("median throughput [tokens/s]")
    ax.set_title("(a) median of the runs at each batch size (unmatched)", fontsize=10)
    ax.tick_params(axis="x", labelbottom=False)
    count_strip(strip, counts, f"valid runs per median (bold: fewer than {THIN})")
    strip.set_xlabel("batch size [#] (log2)")


def _doublings_panel(ax: Any, strip: Any, doubling: dict[str, Any], colors: dict[str, str]) -> None:
    labels = sorted(
        {d for entry in doubling.values() for d in entry["doublings"]}, key=lambda d: int(d.split("->")[0])
    )
    if not labels:
        ax.text(0.5, 0.5, "no matched pair: no job ran at two batch sizes b and 2b", ha="center",
                va="center", transform=ax.transAxes, style="italic", color="dimgray")  # fmt: skip
        ax.set_title("(b) matched pairs per batch doubling", fontsize=10)
        strip.set_visible(False)
        return
    position = {d: i for i, d in enumerate(labels)}
    counts = []
    gpus = [g for g in doubling if g in colors]
    for k, gpu in enumerate(gpus):
        entry = doubling[gpu]
        x = np.array([position[d] for d in entry["doublings"]]) + (k - (len(gpus) - 1) / 2) * _DODGE
        ratios, q25, q75 = (np.array(entry[key]) for key in ("ratios", "q25", "q75"))
        pairs = np.array(entry["pairs"])
        color = colors[gpu]
        for solid in (True, False):
            chosen = (pairs >= THIN) == solid
            if not chosen.any():
                continue
            ax.errorbar(
                x[chosen],
                ratios[chosen],
                yerr=[ratios[chosen] - q25[chosen], q75[chosen] - ratios[chosen]],
                fmt="o",
                color=color,
                markerfacecolor=color if solid else "white",
                capsize=3,
            )
        counts.append(
            (
                short_gpu(gpu),
                color,
                {position[d]: n for d, n in zip(entry["doublings"], pairs.tolist(), strict=True)},
            )
        )
    ax.axhline(1.0, **REFERENCE_STYLE)
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.9), max(high, 1.1))
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.set_xticks(range(len(labels)), [arrow(d) for d in labels])
    ax.tick_params(axis="x", labelbottom=False)
    ax.set_ylabel("throughput(2b) / throughput(b) [×]")
    ax.set_title(
        "(b) matched pairs: the same job at b and 2b (whiskers: middle 50%)",
        fontsize=10,
    )
    count_strip(strip, counts, f"matched pairs (bold: fewer than {THIN})")
    strip.set_xlabel("batch doubling b → 2b")


def grid_figure(numbers: dict[str, Any]) -> Figure | None:
    grid = numbers["throughput_grid"]
    if not grid["cells"]:
        return None
    batches, tokens = grid["batch_sizes"], grid["tokens_per_sample"]
    values = np.full((len(batches), len(tokens)), np.nan)
    cells = {(c["batch_size"], c["tokens_per_sample"]): c for c in grid["cells"]}
    for (b, t), c in cells.items():
        if c["median"] is not None:
            values[batches.index(b), tokens.index(t)] = c["median"]
    figure = Figure(figsize=(1.6 * len(tokens) + 3, 0.55 * len(batches) + 2), layout="constrained")
    ax = figure.subplots()
    ax.set_facecolor("white")
    finite = values[np.isfinite(values)]
    norm = LogNorm(vmin=finite.min(), vmax=max(finite.max(), finite.min() * 1.01)) if finite.size else None
    if norm is not None:
        image = ax.imshow(values, aspect="auto", origin="lower", cmap="viridis", norm=norm)
        figure.colorbar(image, ax=ax, label="median throughput [tokens/s]")
    for i, b in enumerate(batches):
        for j, t in enumerate(tokens):
            cell = cells.get((b, t))
            if cell is None:
                ax.add_patch(_cell_patch(j, i, hatch="///"))
                ax.text(j, i, "no experiment", ha="center", va="center", fontsize=6, backgroundcolor="white")
            elif cell["median"] is None:
                ax.add_patch(_cell_patch(j, i, hatch=None))
                ax.text(
                    j, i, f"no valid run\n(0 of {cell['experiments']})", ha="center", va="center", fontsize=6
                )
            else:
                # Dark text on the light (fast) end of the colour map, light text on the dark end.
                light = norm is not None and norm(cell["median"]) > 0.6
                ax.text(
                    j,
                    i,
                    f"{fmt_tokens(cell['median'])}\nn={cell['valid_runs']}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if light else "white",
                )
    ax.set_xlim(-0.5, len(tokens) - 0.5)
    ax.set_ylim(-0.5, len(batches) - 0.5)
    ax.set_xticks(range(len(tokens)), [str(t) for t in tokens])
    ax.set_yticks(range(len(batches)), [str(b) for b in batches])
    ax.set_xlabel("tokens per sample (sequence length) [tokens]")
    ax.set_ylabel("total batch size [#]")
    ax.set_title(f"Median throughput per batch × sequence length (n = {grid['valid_runs']:,} valid runs)")
    return figure


def _cell_patch(x: int, y: int, *, hatch: str | None) -> Rectangle:
    return Rectangle(
        (x - 0.5, y - 0.5), 1, 1, facecolor="#eeeeee", edgecolor="gray", hatch=hatch, linewidth=0.3
    )
