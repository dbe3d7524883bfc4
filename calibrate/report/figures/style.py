"""What every figure of the report shares: names, colours, how a count is written, how a thin cell or a
thin row is marked, and the strip of counts under a line chart (one row per series, so counts of series
that meet at one x never sit on top of each other)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from twin.domain import GPU_TYPES

DPI = 110
BAR_COLOR = "#4878a8"
# A summary of few pairs is a light, half-height bar: visible, but lighter than one of many pairs.
THIN_BAR_COLOR = "#d5e1ee"
BAR_HEIGHT, THIN_BAR_HEIGHT = 0.8, 0.4
REJECTED_COLOR = "#e6a23c"
RUNTIME_COLOR = "#c0392b"
REFERENCE_STYLE = {"color": "gray", "linestyle": ":", "linewidth": 1}
# A median of fewer runs, or a summary of fewer pairs, than this is drawn hollow: it is shown, but it does
# not look as solid as one that rests on many. Five is where a median stops being decided by one run.
THIN = 5


def short_gpu(name: str) -> str:
    known = GPU_TYPES.get(name)
    return known.short if known else name


def plural(count: int, word: str) -> str:
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def arrow(doubling: str) -> str:
    """A doubling as numbers.json keys it ("1->2") as a reader writes it ("1→2")."""
    return doubling.replace("->", "→")


def fmt_tokens(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 1000 else f"{value:.0f}"


def count_strip(ax: Any, rows: Sequence[tuple[str, str, dict[float, int]]], title: str) -> None:
    """Counts under a chart that shares its x axis: one row per series (label, colour, {x: count})."""
    ax.set_ylim(len(rows) - 0.5, -0.5)
    for i, (_, color, counts) in enumerate(rows):
        for x, count in counts.items():
            weight = "normal" if count >= THIN else "bold"
            ax.text(x, i, f"{count:,}", ha="center", va="center", fontsize=7.5, color=color, weight=weight)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8)
    for tick, (_, color, _) in zip(ax.get_yticklabels(), rows, strict=True):
        tick.set_color(color)
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelbottom=True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, fontsize=8, loc="left")


def interval_bars(
    ax: Any, rows: list[tuple[str, dict[str, Any] | None, str]], unit: str, reference: float
) -> None:
    """Median bars with interquartile whiskers and the pair count, one row per (label, summary, note).

    A row without pairs (summary None or 0 pairs) keeps its place and says why it is empty (`note`), so a
    combination that was tried but never paired does not vanish; a row with pairs appends `note` to its
    label. A row of fewer than THIN pairs is hollow."""
    for i, (_, s, note) in enumerate(rows):
        if not s or not s["pairs"]:
            # On a white ground, so the reference line at 1 does not run through the words.
            ax.text(0.01, i, note or "no pair", va="center", fontsize=8, color="dimgray", style="italic",
                    transform=ax.get_yaxis_transform(),
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})  # fmt: skip
            continue
        thin = s["pairs"] < THIN
        ax.barh(
            i,
            s["median"],
            height=THIN_BAR_HEIGHT if thin else BAR_HEIGHT,
            xerr=[[s["median"] - s["q25"]], [s["q75"] - s["median"]]],
            color=THIN_BAR_COLOR if thin else BAR_COLOR,
            edgecolor=BAR_COLOR,
            linewidth=0.8,
            capsize=3,
            error_kw={"elinewidth": 1, "ecolor": "dimgray" if thin else "black"},
        )
        ax.text(
            s["q75"],
            i,
            f"  {s['median']:.2f}{unit} ({plural(s['pairs'], 'pair')}{'; ' + note if note else ''})",
            va="center",
            fontsize=8,
            color="dimgray" if thin else "black",
        )
    ax.axvline(reference, **REFERENCE_STYLE)
    ax.set_yticks(np.arange(len(rows)), [label for label, _, _ in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)


def thin_legend_handles() -> list[Any]:
    from matplotlib.patches import Patch

    return [
        Patch(facecolor=BAR_COLOR, edgecolor=BAR_COLOR, label=f"median, {THIN} or more pairs"),
        Patch(facecolor=THIN_BAR_COLOR, edgecolor=BAR_COLOR, label=f"median of fewer than {THIN} pairs"),
    ]


def right_edge(summaries: Sequence[dict[str, Any] | None], reference: float) -> float:
    """An x limit that leaves room for the widest whisker and its label."""
    ends = [s["q75"] for s in summaries if s and s["pairs"]] + [reference]
    return max(ends) * 1.3 + 0.25
