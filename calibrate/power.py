"""The power model: average watts per GPU while a job runs.

The benchmark has no power telemetry for whole GPU types (A100-PCIe), so the model learns the share of the
board power (TDP) a GPU draws; a GPU type without any measured run gets its TDP times the median share
measured on the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from calibrate import boosting
from calibrate.compiled import CompiledTrees
from calibrate.features import FEATURE_NAMES
from twin.domain import GPU_TYPES, UNKNOWN_GPU

if TYPE_CHECKING:  # imported where the model is fitted: predicting from compiled trees never needs it
    from sklearn.ensemble import HistGradientBoostingRegressor

POWER_PARAMS: dict[str, Any] = {
    "max_iter": 80,
    "learning_rate": 0.2,
    "max_leaf_nodes": 15,
    "min_samples_leaf": 20,
    "early_stopping": False,
}
DEFAULT_TDP_FRACTION = 0.8  # before any power telemetry is seen
MIN_POWER_RUNS = 20


@dataclass
class PowerUseModel:
    regressor: (
        HistGradientBoostingRegressor | None
    )  # log(watts / TDP); None when too few runs had power telemetry
    tdp_fraction: float
    gpus_with_power: list[str]

    def __post_init__(self) -> None:
        self._compiled = CompiledTrees(self.regressor) if self.regressor is not None else None

    def compiled_trees(self) -> list[CompiledTrees]:
        return [self._compiled] if self._compiled is not None else []

    def predict(self, X: np.ndarray, gpus: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """Watts per GPU for rows of the encoded feature matrix and their (canonical) GPU names."""
        gpus = np.asarray(gpus).astype(str)
        tdp = tdp_watts(gpus)
        watts = tdp * self.tdp_fraction
        measured = np.isin(gpus, self.gpus_with_power)
        if self._compiled is not None and measured.any():
            trees = self._compiled.reference_predict if reference else self._compiled.predict
            watts[measured] = tdp[measured] * np.exp(trees(X[measured]))
        return watts

    def params(self) -> dict[str, Any]:
        return {"tdp_fraction": self.tdp_fraction, "gpus_with_power": self.gpus_with_power}


def tdp_watts(gpus: np.ndarray) -> np.ndarray:
    return np.array([GPU_TYPES.get(g, UNKNOWN_GPU).tdp_watts for g in gpus])


def fit_power(
    X: np.ndarray, gpus: np.ndarray, watts: np.ndarray, weight: np.ndarray | None, *, seed: int
) -> PowerUseModel:
    """Fit on valid runs (rows of the encoded feature matrix, their GPU names); `watts` is NaN where a run
    has no power telemetry."""
    watts = np.asarray(watts, dtype=float)
    measured = np.isfinite(watts) & (watts > 0)
    if measured.sum() < MIN_POWER_RUNS:
        return PowerUseModel(None, DEFAULT_TDP_FRACTION, [])
    gpus = np.asarray(gpus).astype(str)
    share = watts[measured] / tdp_watts(gpus[measured])
    regressor = boosting.regressor(FEATURE_NAMES, seed, POWER_PARAMS)
    regressor.fit(
        boosting.trainable(X[measured], FEATURE_NAMES),
        np.log(share),
        sample_weight=None if weight is None else np.asarray(weight)[measured],
    )
    return PowerUseModel(regressor, float(np.median(share)), sorted(set(gpus[measured])))
