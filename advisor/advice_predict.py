"""The models' numbers for every configuration an answer weighs, in one vectorized evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from twin.domain import JobConfig

BAND_COLUMNS = ("tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90")


@dataclass(frozen=True)
class Predicted:
    """Predictions aligned with a list of configurations."""

    p_valid: np.ndarray  # (n,)
    tps: np.ndarray  # (n, 3): p10, p50, p90 tokens/s
    watts: np.ndarray  # (n,) per GPU
    notes: list[str | None]
    # A calibrated lower bound on p_valid (the failure model's weakest member, bounded on out-of-fold data);
    # equal to p_valid for models that give no bound.
    p_valid_low: np.ndarray  # (n,)
    # Sizes beyond those the models learned from (`calibrate.measured_ranges`): an extrapolation, whose
    # numbers are no evidence, however sure the failure model says it is.
    extrapolated: np.ndarray  # (n,) bool

    def rows(self, start: int, stop: int) -> Predicted:
        """The predictions of rows start..stop-1 (one answer's share of a call)."""
        return Predicted(
            self.p_valid[start:stop],
            self.tps[start:stop],
            self.watts[start:stop],
            self.notes[start:stop],
            self.p_valid_low[start:stop],
            self.extrapolated[start:stop],
        )


class ModelsUnusable(RuntimeError):
    """The models in use failed to predict (e.g. saved by a version of finetwin with other features)."""


def predict(models: Any, configs: Sequence[JobConfig]) -> Predicted:
    """One vectorized evaluation of every configuration, power included (`predict_columns` when the models
    have it)."""
    n = len(configs)
    extrapolated = np.zeros(n, dtype=bool)
    if hasattr(models, "predict_columns"):
        from calibrate.config_frame import configs_to_columns

        try:
            columns = models.predict_columns(configs_to_columns(configs), power=True)
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelsUnusable(f"the models in use cannot predict: {exc}") from exc
        p_valid = np.asarray(columns["p_valid"], dtype=float)
        low = np.asarray(columns.get("p_valid_low", p_valid), dtype=float)
        extrapolated = np.asarray(columns.get("extrapolated", extrapolated), dtype=bool)
        tps = np.column_stack([np.asarray(columns[name], dtype=float) for name in BAND_COLUMNS])
        watts = np.asarray(columns["power_watts"], dtype=float)
        notes = [n if isinstance(n, str) and n else None for n in columns.get("note", [None] * n)]
    else:
        p_valid = np.asarray(models.predict_failure(configs), dtype=float)
        tps = np.asarray(models.predict_throughput(configs), dtype=float).reshape(n, 3)
        watts = np.asarray(models.predict_power_watts(configs), dtype=float)
        notes = [None] * n
        low = p_valid
    return Predicted(
        p_valid=p_valid, tps=tps, watts=watts, notes=notes, p_valid_low=np.minimum(low, p_valid),
        extrapolated=extrapolated,
    )  # fmt: skip
