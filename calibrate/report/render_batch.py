"""report.md's answer to "does a bigger batch help?" on one GPU: the matched ratio per doubling beside
Figure 3's unmatched medians, and where the two disagree, which one to believe."""

from __future__ import annotations

from typing import Any

from calibrate.report.figures.style import arrow, short_gpu
from calibrate.report.markdown import NO_DATA, fmt, table

READ_MATCHED = (
    "**Which to believe.** Figure 3a's medians compare whatever ran at each batch size, and what ran changes "
    "from one batch size to the next (large models only fit small batches; long sequences fail at large "
    "ones). Figure 3b compares the same job at b and 2b. Where the two disagree, believe the matched ratio "
    "(3b): the unmatched step moved because the mix of runs moved."
)


def batch_section(numbers: dict[str, Any]) -> list[str]:
    doubling = numbers.get("batch_doubling") or {}
    medians = numbers["throughput_single_gpu"]["by_gpu_model"]
    if not any(entry["doublings"] for entry in doubling.values()):
        return [f"{NO_DATA} on matched batch doublings: no one-GPU job ran at two batch sizes b and 2b._"]
    rows = []
    for gpu, entry in doubling.items():
        unmatched = _unmatched_steps(medians.get(gpu, {}))
        for i, step in enumerate(entry["doublings"]):
            rows.append(
                [
                    short_gpu(gpu),
                    arrow(step),
                    str(entry["pairs"][i]),
                    fmt(entry["ratios"][i], 2, "×"),
                    f"{fmt(entry['q25'][i])}–{fmt(entry['q75'][i])}",
                    fmt(unmatched.get(step), 2, "×"),
                ]
            )
    parts = [
        "### Batch size on matched pairs (Figure 3b)",
        READ_MATCHED,
        table(
            ["GPU type", "doubling", "pairs", "matched median ratio", "IQR (q25–q75)", "unmatched step (3a)"],
            rows,
        ),
    ]
    parts += [line for gpu, entry in doubling.items() if (line := _verdict(gpu, entry, medians.get(gpu, {})))]
    return parts


def _unmatched_steps(entry: dict[str, Any]) -> dict[str, float]:
    """Figure 3a's step b → 2b: the ratio of the two unmatched medians, where both batch sizes ran."""
    cells = entry.get("median_tokens_per_s_by_batch", {})
    medians = {int(b): c["median"] for b, c in cells.items()}
    return {f"{b}->{2 * b}": medians[2 * b] / medians[b] for b in medians if 2 * b in medians}


def _verdict(gpu: str, entry: dict[str, Any], single: dict[str, Any]) -> str:
    """One sentence per GPU type: the log2 fit, and the steps where unmatched medians and matched pairs
    point in opposite directions (one above 1, the other below)."""
    fit = entry["log2_fit"]
    unmatched = _unmatched_steps(single)
    disagree = [
        f"{arrow(step)} ({fmt(unmatched[step], 2, '×')} unmatched vs {fmt(ratio, 2, '×')} matched)"
        for step, ratio in zip(entry["doublings"], entry["ratios"], strict=True)
        if step in unmatched and (unmatched[step] < 1) != (ratio < 1)
    ]
    text = f"**{short_gpu(gpu)}**: "
    if fit["slope"] is not None:
        text += (
            f"least squares of the medians on log2(batch) over {fit['points']} batch sizes: "
            f"{fit['slope']:+,.0f} tokens/s per doubling, R² {fmt(fit['r2'])}. "
        )
    if entry["ratios"]:
        low = min(entry["ratios"])
        at = arrow(entry["doublings"][entry["ratios"].index(low)])
        shown = fmt(low, 3 if round(low, 2) == 1 else 2)  # 0.997 is a loss, not "1.00"
        text += (
            f"Every matched doubling gains (lowest {shown}× at {at}). "
            if low >= 1
            else f"Not every matched doubling gains (lowest {shown}× at {at}). "
        )
    gain = single.get("gain_batch128_vs_8")
    from_8_to_128 = [
        r
        for s, r in zip(entry["doublings"], entry["ratios"], strict=True)
        if 8 <= int(s.split("->")[0]) < 128
    ]
    if gain is not None and from_8_to_128 and gain < 1 <= min(from_8_to_128):
        text += (
            f"The unmatched medians put batch 128 at {fmt(gain, 2, '×')} batch 8, yet every matched doubling "
            "from 8 to 128 gains: the fall is the mix of runs, not the batch. "
        )
    if disagree:
        text += "Unmatched and matched disagree at " + "; ".join(disagree) + "."
    return text.strip()
