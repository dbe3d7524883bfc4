"""report.md's opening section: what the data holds, so every later number can be read against it."""

from __future__ import annotations

from typing import Any

from calibrate.report.figures.style import short_gpu
from calibrate.report.markdown import NO_DATA, fmt


def inventory_section(numbers: dict[str, Any]) -> str:
    inv = numbers["inventory"]
    if not inv["experiments"]:
        return f"## The data\n\n{NO_DATA}: the input holds no experiments._"
    size = inv["model_params_billion"]
    no_power = inv["gpu_models_without_power_telemetry"]
    lines = [
        f"- {inv['experiments']:,} experiments in {inv['experiment_ids']:,} distinct `experiment_id`s, "
        f"{inv['llms']} LLMs",
        (
            f"- model sizes {size['min']:g} B ({size['smallest_model']}) to "
            f"{size['max']:g} B ({size['largest_model']}) parameters"
            if size["min"] is not None
            else "- model sizes: none known"
        ),
        f"- {fmt(inv['a100_sxm_rows_pct'], 1)} % of the experiments ran on A100-SXM: a number pooled over "
        "GPU types is mostly an A100-SXM number",
        "- GPU types without power telemetry in any experiment: "
        + (", ".join(short_gpu(g) for g in no_power) if no_power else "none"),
    ]
    if inv["models_without_known_size"]:
        lines.append("- models of unknown size: " + ", ".join(inv["models_without_known_size"]))
    return "## The data\n\n" + "\n".join(lines)
