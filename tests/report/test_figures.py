"""The figures a reviewer looks at, drawn from the real sample's numbers: no text sits on another or falls
off the canvas, line charts start at 0, thin medians and thin rows look thin, Figure 6 compares on one
scale and keeps the rows that have no pair."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from calibrate.loader import load_benchmark
from calibrate.report import compute_numbers
from calibrate.report.figures import DRAWERS
from calibrate.report.figures.style import BAR_COLOR, THIN_BAR_COLOR


@pytest.fixture(scope="module")
def numbers(sample_csv: Path) -> dict[str, Any]:
    return compute_numbers(load_benchmark(sample_csv), source=str(sample_csv))


def drawn(figure: Figure | None) -> Figure:
    assert figure is not None
    FigureCanvasAgg(figure).draw()
    return figure


@pytest.fixture(scope="module")
def figures(numbers: dict[str, Any]) -> dict[str, Figure]:
    """Every figure of the sample, drawn once for the module (drawing is most of these tests' time)."""
    return {name: drawn(draw(numbers)) for name, draw in DRAWERS.items()}


def visible_texts(figure: Figure) -> list[Text]:
    texts = []
    for text in figure.findobj(Text):
        if not (text.get_visible() and text.get_text().strip()):
            continue
        axes = text.axes
        if axes is not None and not axes.get_visible():
            continue
        texts.append(text)
    return texts


def tick_labels_in_view(figure: Figure) -> set[int]:
    """ids of the tick labels matplotlib draws: a tick outside the view keeps a label it does not draw."""
    drawn_ids = set()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            low, high = sorted(axis.get_view_interval())
            for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
                location = tick.get_loc()
                if location is not None and low - 1e-9 <= location <= high + 1e-9:
                    drawn_ids.update({id(tick.label1), id(tick.label2)})
    return drawn_ids


@pytest.mark.parametrize("name", list(DRAWERS))
def test_no_text_overlaps_another_or_leaves_the_canvas(figures: dict[str, Figure], name: str) -> None:
    assert_texts_apart(figures[name], name)


def assert_texts_apart(figure: Figure, name: str) -> None:
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    canvas = figure.bbox
    all_ticks = {
        id(t) for ax in figure.axes for a in (ax.xaxis, ax.yaxis) for t in a.get_ticklabels(which="both")
    }
    in_view = tick_labels_in_view(figure)
    texts = [t for t in visible_texts(figure) if id(t) not in all_ticks or id(t) in in_view]
    boxes = [(t, t.get_window_extent(renderer)) for t in texts]
    for text, box in boxes:
        assert box.x0 >= canvas.x0 - 1 and box.x1 <= canvas.x1 + 1, f"{text.get_text()!r} leaves the canvas"
        assert box.y0 >= canvas.y0 - 1 and box.y1 <= canvas.y1 + 1, f"{text.get_text()!r} leaves the canvas"
    for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
        # Grid cells of Figure 4 hold two lines of one text each; any overlap elsewhere is a collision.
        assert not box_a.overlaps(box_b), f"{a.get_text()!r} overlaps {b.get_text()!r} in {name}"


def test_line_charts_start_at_zero(figures: dict[str, Figure]) -> None:
    for name in ("single_gpu", "scaling"):
        main = figures[name].axes[0]
        assert main.get_ylim()[0] == 0, name


def test_figure3_shows_the_matched_doublings_and_marks_thin_medians(
    numbers: dict[str, Any], figures: dict[str, Figure]
) -> None:
    figure = figures["single_gpu"]
    medians_ax, doublings_ax, doublings_strip = figure.axes[0], figure.axes[1], figure.axes[3]
    assert "matched" in doublings_ax.get_title()
    doublings = {d for e in numbers["batch_doubling"].values() for d in e["doublings"]}
    assert [t.get_text() for t in doublings_strip.get_xticklabels()] == sorted(
        (d.replace("->", "→") for d in doublings), key=lambda d: int(d.split("→")[0])
    )
    # Hollow markers: exactly the medians of fewer than five runs.
    thin = sum(
        c["runs"] < 5
        for e in numbers["throughput_single_gpu"]["by_gpu_model"].values()
        for c in e["median_tokens_per_s_by_batch"].values()
    )
    hollow = sum(
        len(line.get_xdata())
        for line in medians_ax.get_lines()
        if line.get_markerfacecolor() in ("white", "w")
    )
    assert hollow == thin > 0


def bars(ax: Any) -> list[Rectangle]:
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_width() > 0]


def test_figure5b_draws_rows_of_few_pairs_lighter_and_counts_in_the_singular(
    figures: dict[str, Figure],
) -> None:
    figure = figures["efficiency"]
    colors = {to_hex(p.get_facecolor()) for ax in figure.axes for p in bars(ax)}
    assert colors == {BAR_COLOR, THIN_BAR_COLOR}
    labels = [t.get_text() for t in visible_texts(figure)]
    assert any("(1 pair)" in t for t in labels)
    assert not any("1 pairs" in t for t in labels)


def test_figure6_compares_on_one_scale_and_keeps_rows_without_pairs(
    numbers: dict[str, Any], figures: dict[str, Figure]
) -> None:
    figure = figures["speedups"]
    panels = [ax for ax in figure.axes if ax.get_yticklabels()]
    assert len(panels) == 3
    assert len({ax.get_xlim() for ax in panels}) == 1
    moe = numbers["fast_moe"]
    assert "2" in moe["by_method_and_expert_parallel_degree"]["full"]
    assert "2" not in moe["by_method_and_expert_parallel_degree"]["lora"]
    rows = [t.get_text() for t in panels[1].get_yticklabels()]
    assert "lora, EP 2" in rows
    notes = [t.get_text() for t in panels[1].texts]
    assert any(n.startswith("no pair: no lora run at EP 2") for n in notes)
    for ep, experiments in moe["degrees_without_valid_run"].items():
        assert f"EP {ep}, any method" in rows
        assert any(f"tried in {experiments} experiment" in n for n in notes)


def test_figure6_without_moe_pairs_but_with_tried_degrees_still_lists_them(numbers: dict[str, Any]) -> None:
    only_tried = copy.deepcopy(numbers)
    only_tried["fast_moe"].update(by_expert_parallel_degree={}, by_method_and_expert_parallel_degree={})
    figure = drawn(DRAWERS["speedups"](only_tried))
    # No MoE pair: the MoE panel goes (it has no bar), RoCE and fast kernels stay on their shared scale.
    titles = [ax.get_title(loc="left") for ax in figure.axes if ax.get_yticklabels()]
    assert titles == ["(a) RoCE (multi-node jobs)", "(c) fast kernels"]


def test_figure3_without_any_matched_doubling_says_so(tmp_path: Path) -> None:
    from tests.report.conftest import row, write_bench

    # Batches 1 and 8 only: medians to plot, but no job ran at b and 2b.
    bench = write_bench(
        tmp_path / "b.csv", [row(tps=3000, gpu="L40S", batch=1), row(tps=4000, gpu="L40S", batch=8)]
    )
    numbers = compute_numbers(load_benchmark(bench), source="hand-made")
    assert numbers["batch_doubling"]["L40S"]["doublings"] == []
    figure = drawn(DRAWERS["single_gpu"](numbers))
    assert any("no matched pair" in t.get_text() for t in figure.axes[1].texts)
    assert not figure.axes[3].get_visible()  # no strip of pair counts without pairs
    assert_texts_apart(figure, "single_gpu without pairs")
