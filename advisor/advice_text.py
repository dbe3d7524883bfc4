"""The text rendering of one job's advice for `finetwin advise` (`--json` gives everything)."""

from __future__ import annotations

from advisor.advice_schemas import AdviceOut, ConfigOut, Prediction
from twin.domain import unseen_model_warning


def _band(prediction: Prediction | None) -> str:
    if prediction is None or prediction.tokens_per_second is None:
        return "no prediction"
    tps = prediction.tokens_per_second
    text = f"{tps.p50:,.0f} tokens/s (p10-p90 {tps.p10:,.0f}-{tps.p90:,.0f})"
    if prediction.run_time_s is not None:
        text += f", {_run_time(prediction.run_time_s.p50)}"
    if prediction.gpu_hours is not None:
        text += f", {prediction.gpu_hours:,.1f} GPU-h"
    if prediction.energy_kwh is not None:
        text += f", {prediction.energy_kwh:,.1f} kWh"
    if prediction.p_valid is not None:
        text += f", p(runs) {prediction.p_valid:.2f}"
    if prediction.p_valid_low is not None:
        text += f" (>= {prediction.p_valid_low:.2f})"
    return text


def _run_time(seconds: float) -> str:
    """A run time to read at a glance: a 2 s run read `0.00 h`."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:,.2f} h"


def _config_line(config: ConfigOut) -> str:
    return (
        f"{config.number_gpus} GPU(s) on {config.number_nodes} node(s), batch {config.batch_size}, "
        f"fast kernels {'on' if config.fast_kernels else 'off'}, "
        f"RoCE {'on' if config.enable_roce else 'off'}, "
        f"fast MoE {config.fast_moe or 'off'}"
    )


def render_text(answer: AdviceOut) -> str:
    """A short human-readable answer; `--json` gives everything, evidence included."""
    c = answer.config
    lines = [
        f"{c.model_name} ({c.method}) on {c.gpu_model}: {_config_line(c)}",
        *(f"warning: {w}" for w in [unseen_model_warning(c.model_name)] if w),  # up front, not a last note
        f"work: {answer.work.dataset_tokens:,.0f} tokens{' (assumed)' if answer.work.assumed else ''}; "
        f"models: {answer.model_version or 'none'}",
        f"verdict: {answer.verdict.status} - {answer.verdict.message}",
    ]
    if answer.verdict.prediction is not None:
        lines.append(f"  as asked: {_band(answer.verdict.prediction)}")
    if answer.repair is not None:
        changes = "; ".join(f"{ch.field} {ch.old} -> {ch.new}" for ch in answer.repair.changes)
        lines.append(f"repair: {changes}: {_band(answer.repair.prediction)}")
        lines.append(f"  confidence {answer.repair.confidence}")
        if answer.repair.alternative is not None:
            label = "instead" if not answer.repair.confident else "next-safest"
            alt = answer.repair.alternative
            lines.append(f"  {label}: {_config_line(alt.config)}: {_band(alt.prediction)}")
    for label, option in (
        ("fewest GPUs", answer.fewest_gpus),
        ("best throughput", answer.best_throughput),
        ("best cost", answer.best_cost),
    ):
        if option is None:
            lines.append(f"{label}: none recommended (see the note)")
        else:
            lines.append(f"{label}: {_config_line(option.config)}: {_band(option.prediction)}")
            lines.append(f"  confidence {option.confidence}")
            if option.alternative is not None:
                alt = option.alternative
                lines.append(f"  next-safest: {_config_line(alt.config)}: {_band(alt.prediction)}")
    lines.append(f"placement: {answer.placement.message}")
    for opt in answer.optimizations:
        lines.append(f"{opt.name}: {'yes' if opt.recommended else 'no'} ({opt.setting}) - {opt.message}")
    lines.extend(f"note: {note}" for note in answer.notes)
    return "\n".join(lines)
