"""The report's figures, drawn from the numbers (never from raw rows) so a figure cannot disagree with
numbers.json. Each has a title, axes with units and its counts; a figure without data is not drawn
(the function returns None and the report says so).

Uses matplotlib's object API on the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from twin.domain import GPU_TYPES

DPI = 110
REJECTED_COLOR = "#e6a23c"
RUNTIME_COLOR = "#c0392b"
FIGURE_FILES = {
    "failures": "fig2_failure_ratios.png",
    "single_gpu": "fig3_throughput_by_batch_single_gpu.png",
    "grid": "fig4_throughput_batch_x_tokens.png",
    "scaling": "fig5_throughput_by_gpu_count.png",
    "efficiency": "fig5b_scaling_efficiency.png",
    "speedups": "fig6_optimization_speedups.png",
}


def draw_all(numbers: dict[str, Any], out_dir: Path) -> dict[str, str | None]:
    """Every figure that has data, as {name: file name or None}."""
    drawers: dict[str, Callable[[dict[str, Any]], Figure | None]] = {
        "failures": failures_figure,
        "single_gpu": single_gpu_figure,
        "grid": grid_figure,
        "scaling": scaling_figure,
        "efficiency": efficiency_figure,
        "speedups": speedups_figure,
    }
    written: dict[str, str | None] = {}
    for name, draw in drawers.items():
        figure = draw(numbers)
        if figure is None:
            # A figure left by an earlier report in the same directory would show data this one does not have.
            (out_dir / FIGURE_FILES[name]).unlink(missing_ok=True)
            written[name] = None
            continue
        FigureCanvasAgg(figure)
        figure.savefig(out_dir / FIGURE_FILES[name], dpi=DPI)
        written[name] = FIGURE_FILES[name]
    return written


def short_gpu(name: str) -> str:
    known = GPU_TYPES.get(name)
    return known.short if known else name


def _fmt_tokens(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


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


def single_gpu_figure(numbers: dict[str, Any]) -> Figure | None:
    single = numbers["throughput_single_gpu"]
    if not single["valid_single_gpu_runs"]:
        return None
    figure = Figure(figsize=(9, 5.5), layout="constrained")
    ax = figure.subplots()
    for gpu, entry in single["by_gpu_model"].items():
        cells = entry["median_tokens_per_s_by_batch"]
        batches = [int(b) for b in cells]
        medians = [cells[b]["median"] for b in cells]
        ax.plot(
            batches,
            medians,
            marker="o",
            label=f"{short_gpu(gpu)} ({sum(c['runs'] for c in cells.values())} runs)",
        )
        for b, c in cells.items():
            ax.annotate(
                f"n={c['runs']}", (int(b), c["median"]), textcoords="offset points", xytext=(3, 4), fontsize=7
            )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size [#] (log2)")
    ax.set_ylabel("median throughput [tokens/s]")
    ax.legend()
    ax.set_title(
        "Throughput by batch size on one GPU, per GPU type "
        f"(n = {single['valid_single_gpu_runs']:,} valid runs)"
    )
    return figure


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
                    f"{_fmt_tokens(cell['median'])}\nn={cell['valid_runs']}",
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


def _cell_patch(x: int, y: int, *, hatch: str | None) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle(
        (x - 0.5, y - 0.5), 1, 1, facecolor="#eeeeee", edgecolor="gray", hatch=hatch, linewidth=0.3
    )


def scaling_figure(numbers: dict[str, Any]) -> Figure | None:
    by_count = numbers["throughput_by_gpu_count"]
    if not by_count:
        return None
    figure = Figure(figsize=(9, 5.5), layout="constrained")
    ax = figure.subplots()
    for method, cells in by_count.items():
        gpus = [int(g) for g in cells]
        medians = [cells[g]["median"] for g in cells]
        runs = sum(c["runs"] for c in cells.values())
        (line,) = ax.plot(gpus, medians, label=f"{method} ({runs} runs)")
        for g, c in cells.items():
            multi_node = max(c["nodes"]) > 1
            ax.plot(
                int(g),
                c["median"],
                marker="s" if multi_node else "o",
                color=line.get_color(),
                markerfacecolor="white" if multi_node else line.get_color(),
            )
            ax.annotate(
                f"n={c['runs']}", (int(g), c["median"]), textcoords="offset points", xytext=(3, 4), fontsize=7
            )
    ax.axvline(8.5, color="gray", linestyle=":", linewidth=1)
    ax.text(
        8.6, ax.get_ylim()[1] * 0.95, "1 node = 8 GPUs │ 2–4 nodes (hollow squares)", fontsize=8, va="top"
    )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("number of GPUs [#] (log2)")
    ax.set_ylabel("median throughput [tokens/s]")
    ax.legend(loc="upper left")
    ax.set_title("Throughput by GPU count per fine-tuning method (valid runs)")
    return figure


def _interval_bars(ax: Any, rows: list[tuple[str, dict[str, Any]]], unit: str, reference: float) -> None:
    """Median bars with interquartile whiskers and the pair count, one row per (label, summary)."""
    rows = [(label, s) for label, s in rows if s["pairs"]]
    y = np.arange(len(rows))
    medians = [s["median"] for _, s in rows]
    lower = [s["median"] - s["q25"] for _, s in rows]
    upper = [s["q75"] - s["median"] for _, s in rows]
    ax.barh(y, medians, xerr=[lower, upper], color="#4878a8", capsize=3)
    for i, (_, s) in enumerate(rows):
        ax.text(s["q75"] + 0.03, i, f"{s['median']:.2f}{unit} ({s['pairs']} pairs)", va="center", fontsize=8)
    ax.axvline(reference, color="gray", linestyle=":", linewidth=1)
    ax.set_yticks(y, [label for label, _ in rows])
    ax.invert_yaxis()
    right = max([s["q75"] for _, s in rows] + [reference])
    ax.set_xlim(0, right * 1.35 + 0.2)


def efficiency_rows(block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, summary) per doubling, campaign and, across nodes, network."""
    rows: list[tuple[str, dict[str, Any]]] = []
    for doubling, entry in block["per_doubling"].items():
        for campaign, value in entry["by_campaign"].items():
            if entry["placement"] == "intra-node":
                rows.append((f"{doubling} GPUs, intra-node, {campaign}", value))
            else:
                rows += [(f"{doubling} GPUs, {campaign}, {roce}", s) for roce, s in value.items()]
    return rows


def efficiency_figure(numbers: dict[str, Any]) -> Figure | None:
    panels = []
    for kind in ("weak_scaling", "strong_scaling"):
        rows = efficiency_rows(numbers[kind])
        if any(s["pairs"] for _, s in rows):
            panels.append((kind, rows))
    if not panels:
        return None
    figure = Figure(figsize=(11, 0.45 * sum(len(r) for _, r in panels) + 2.5), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (kind, rows) in zip(axes, panels, strict=True):
        _interval_bars(ax, rows, "", 1.0)
        batch = "equal batch per GPU" if kind == "weak_scaling" else "equal total batch"
        ax.set_title(
            f"{kind.replace('_', ' ')} ({batch}, {numbers[kind]['pairs']} matched pairs)", fontsize=10
        )
        ax.set_xlabel("efficiency = throughput(2g) / (2 × throughput(g)) [ratio]; whiskers: middle 50%")
    figure.suptitle("Scaling efficiency per GPU doubling on matched pairs, per campaign")
    return figure


def speedups_figure(numbers: dict[str, Any]) -> Figure | None:
    roce = numbers["roce"]
    moe = numbers["fast_moe"]["by_method_and_expert_parallel_degree"]
    kernels = numbers["fast_kernels"]
    panels = [
        ("(a) RoCE (multi-node)", [("all campaigns", roce["all"])] + list(roce["by_campaign"].items())),
        (
            "(b) fast MoE vs off",
            [(f"{m}, EP {ep}", s) for m, by_ep in moe.items() for ep, s in by_ep.items()],
        ),
        ("(c) fast kernels", [("all pairs", kernels)]),
    ]
    panels = [(title, rows) for title, rows in panels if any(s["pairs"] for _, s in rows)]
    if not panels:
        return None
    heights = [max(1, sum(1 for _, s in rows if s["pairs"])) for _, rows in panels]
    figure = Figure(figsize=(10, 0.5 * sum(heights) + 2.5), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (title, rows) in zip(axes, panels, strict=True):
        _interval_bars(ax, rows, "×", 1.0)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("speedup = throughput(on) / throughput(off) [×]; whiskers: middle 50%")
    figure.suptitle("Median speedup of each optimization over matched pairs")
    return figure
