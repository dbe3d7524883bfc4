"""report.md's opening section: what the data holds, so every later number can be read against it."""

from __future__ import annotations

from typing import Any

from calibrate.report.figures.style import plural, short_gpu
from calibrate.report.markdown import NO_DATA, fmt


def inventory_section(numbers: dict[str, Any]) -> str:
    inv = numbers["inventory"]
    if not inv["experiments"]:
        return f"## The data\n\n{NO_DATA}: the input holds no experiments._"
    size = inv["model_params_billion"]
    no_power = inv["gpu_models_without_power_telemetry"]
    if size["min"] is None:
        sizes = "- model sizes: none known"
    elif size["smallest_model"] == size["largest_model"]:
        sizes = f"- model size {size['min']:g} B parameters ({size['smallest_model']})"
    else:
        sizes = (
            f"- model sizes {size['min']:g} B ({size['smallest_model']}) to "
            f"{size['max']:g} B ({size['largest_model']}) parameters"
        )
    lines = [
        f"- {plural(inv['experiments'], 'experiment')} in "
        f"{plural(inv['experiment_ids'], 'distinct `experiment_id`')}, {plural(inv['llms'], 'LLM')}",
        sizes,
        _pooled_gpu_line(inv.get("most_common_gpu")),
        "- GPU types without power telemetry in any experiment: "
        + (", ".join(short_gpu(g) for g in no_power) if no_power else "none"),
    ]
    if inv["models_without_known_size"]:
        lines.append("- models of unknown size: " + ", ".join(inv["models_without_known_size"]))
    return "## The data\n\n" + "\n".join(line for line in lines if line)


def _pooled_gpu_line(top: dict[str, Any] | None) -> str:
    """Which GPU type a number pooled over GPU types mostly speaks of (in the benchmark, the A100-SXM), or
    that none holds most of the experiments."""
    if top is None:  # a report written before this was counted
        return ""
    name, share = short_gpu(top["gpu_model"]), top["rows_pct"]
    if share >= 100:
        return f"- every experiment ran on {name}"
    if share > 50:
        return (
            f"- {fmt(share, 1)} % of the experiments ran on {name}: a number pooled over GPU types is mostly "
            f"made of {name} runs"
        )
    return (
        f"- no GPU type holds most of the experiments (the most, {fmt(share, 1)} %, ran on {name}): a number "
        "pooled over GPU types mixes them"
    )
