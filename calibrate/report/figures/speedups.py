"""Figure 6: the median speedup of each optimization over matched pairs.

The point of the figure is to compare optimizations, so every panel shares one x scale. A combination that
was tried but has no pair keeps its row with a note, instead of vanishing."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from calibrate.report.figures.style import interval_bars, plural, right_edge, thin_legend_handles

Row = tuple[str, dict[str, Any] | None, str]


def speedup_panels(numbers: dict[str, Any]) -> list[tuple[str, list[Row]]]:
    """(title, rows) per optimization that has at least one row to show."""
    roce = numbers["roce"]
    kernels = numbers["fast_kernels"]
    share = kernels.get("share_faster")
    panels: list[tuple[str, list[Row]]] = [
        (
            "(a) RoCE (multi-node jobs)",
            [("all campaigns", roce["all"], "")] + [(c, s, "") for c, s in roce["by_campaign"].items()],
        ),
        (
            "(b) fast MoE vs off, per method and expert-parallel (EP) degree",
            fast_moe_rows(numbers["fast_moe"]),
        ),
        (
            "(c) fast kernels",
            [("all pairs", kernels, "" if share is None else f"{100 * share:.0f}% of pairs faster")],
        ),
    ]
    return [(title, rows) for title, rows in panels if any(s and s["pairs"] for _, s, _ in rows)]


def fast_moe_rows(moe: dict[str, Any]) -> list[Row]:
    """Every method × degree that has a pair for some method, with 'no pair' where this method has none,
    then the degrees that were tried but never ran."""
    degrees = sorted(moe["by_expert_parallel_degree"], key=int)
    rows: list[Row] = []
    for method, by_ep in moe["by_method_and_expert_parallel_degree"].items():
        for ep in degrees:
            summary = by_ep.get(ep)
            note = "" if summary else f"no pair: no {method} run at EP {ep} has a match with fast MoE off"
            rows.append((f"{method}, EP {ep}", summary, note))
    for ep, experiments in moe.get("degrees_without_valid_run", {}).items():
        rows.append(
            (f"EP {ep}, any method", None, f"tried in {plural(experiments, 'experiment')}, no valid run")
        )
    return rows


def speedups_figure(numbers: dict[str, Any]) -> Figure | None:
    panels = speedup_panels(numbers)
    if not panels:
        return None
    heights = [len(rows) for _, rows in panels]
    figure = Figure(figsize=(10, 0.42 * sum(heights) + 1.0 * len(panels) + 1.6), layout="constrained")
    axes = figure.subplots(len(panels), 1, squeeze=False, sharex=True, height_ratios=heights)[:, 0]
    right = right_edge([s for _, rows in panels for _, s, _ in rows], 1.0)
    for ax, (title, rows) in zip(axes, panels, strict=True):
        interval_bars(ax, rows, "×", 1.0)
        ax.set_xlim(0, right)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_title(title, fontsize=10, loc="left")
    axes[-1].set_xlabel("speedup = throughput(on) / throughput(off) [×], one scale for all panels; "
                        "whiskers: middle 50%")  # fmt: skip
    figure.legend(handles=thin_legend_handles(), loc="outside lower center", ncols=2)
    figure.suptitle("Median speedup of each optimization over matched pairs")
    return figure
