"""The power model: average watts per GPU while a job runs.

The benchmark has no power telemetry for whole GPU types (A100-PCIe), so the model learns the share of the
board power (TDP) a GPU draws; a GPU type without any measured run gets its TDP times the median share
measured on the others.

How wrong the model is, as the twin draws it (`twin.protocols.PowerErrorModel`): per novelty level of the
configuration (`calibrate.performance.levels_of`), the spread of log(watts) on held-out runs and the share of
it an error family shares (`calibrate.correlation`). The sum over a workload's jobs is what an energy
forecast is: on random held-out rows of the sample the per-job errors (~4 % median) cancel to ~1 %, but on
held-out configuration blocks the whole block's power was 8-10 % off (three of ten blocks), an error a
forecast that took each job's power as known could not show in its band.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from calibrate import boosting
from calibrate.compiled import CompiledTrees
from calibrate.correlation import MAX_SHARE, Z90, shared_share
from calibrate.features import FEATURE_NAMES
from calibrate.performance import LEVELS, at_levels, fold_neighbourhood, held_out_residuals, levels_of
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
# The held-out residuals: one random fold and two contiguous blocks (the table is sorted by configuration, so
# a block holds regions its fold never saw) of a split into RESIDUAL_PARTS, each fit on at most
# RESIDUAL_MAX_TRAIN_ROWS in fewer, larger steps: they size the error, they are not the model (~0.3 s of a
# calibration on the full benchmark; with the model's own parameters and 3,000 rows, ~0.6 s).
RESIDUAL_PARTS = 6
RESIDUAL_BLOCKS = (0, RESIDUAL_PARTS - 1)
RESIDUAL_MAX_TRAIN_ROWS = 2000
RESIDUAL_PARAMS: dict[str, Any] = POWER_PARAMS | {"max_iter": 30, "learning_rate": 0.4}
MIN_RESIDUALS_PER_LEVEL = 30
# Standardized residuals beyond this are one run's oddity, not evidence of what a family shares.
Z_CLIP = 3.0


@dataclass
class PowerUseModel:
    regressor: (
        HistGradientBoostingRegressor | None
    )  # log(watts / TDP); None when too few runs had power telemetry
    tdp_fraction: float
    gpus_with_power: list[str]
    # novelty level -> standard deviation of the log(watts) error, and the share of it a family shares
    # (empty in a version fitted before them: the twin takes the power as known)
    error_scale: dict[str, float] = field(default_factory=dict)
    error_correlation: dict[str, float] = field(default_factory=dict)
    # a GPU type without power telemetry (TDP times the measured types' median share): their shares' spread
    unmeasured_error_scale: float = 0.0

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

    def predict_error(self, levels: np.ndarray, gpus: np.ndarray) -> np.ndarray:
        """(n, 2): per row of novelty `levels` and (canonical) GPU names, the standard deviation of its
        log(watts) error and the share of it its error family shares. A GPU type without power telemetry
        shares its whole error: the same guessed share of TDP for every job on it."""
        scale = at_levels(self.error_scale, levels, 0.0)
        share = at_levels(self.error_correlation, levels, 0.0)
        unmeasured = ~np.isin(np.asarray(gpus).astype(str), self.gpus_with_power)
        scale[unmeasured] = self.unmeasured_error_scale
        share[unmeasured] = MAX_SHARE
        return np.column_stack([scale, share])

    def params(self) -> dict[str, Any]:
        return {
            "tdp_fraction": self.tdp_fraction,
            "gpus_with_power": self.gpus_with_power,
            "error_scale": self.error_scale,
            "error_correlation": self.error_correlation,
            "unmeasured_error_scale": self.unmeasured_error_scale,
        }

    @classmethod
    def from_params(
        cls, regressor: HistGradientBoostingRegressor | None, params: dict[str, Any]
    ) -> PowerUseModel:
        return cls(
            regressor,
            float(params["tdp_fraction"]),
            [str(g) for g in params["gpus_with_power"]],
            {str(k): float(v) for k, v in (params.get("error_scale") or {}).items()},
            {str(k): float(v) for k, v in (params.get("error_correlation") or {}).items()},
            float(params.get("unmeasured_error_scale") or 0.0),
        )


def tdp_watts(gpus: np.ndarray) -> np.ndarray:
    return np.array([GPU_TYPES.get(g, UNKNOWN_GPU).tdp_watts for g in gpus])


def fit_power(
    X: np.ndarray,
    gpus: np.ndarray,
    watts: np.ndarray,
    weight: np.ndarray | None,
    *,
    seed: int,
    families: np.ndarray | None = None,
) -> PowerUseModel:
    """Fit on valid runs (rows of the encoded feature matrix, their GPU names); `watts` is NaN where a run
    has no power telemetry. `families`: each row's error family (`twin.families`), to measure how much of
    the error a family shares."""
    watts = np.asarray(watts, dtype=float)
    measured = np.isfinite(watts) & (watts > 0)
    if measured.sum() < MIN_POWER_RUNS:
        return PowerUseModel(None, DEFAULT_TDP_FRACTION, [])
    gpus = np.asarray(gpus).astype(str)
    share = watts[measured] / tdp_watts(gpus[measured])
    X_measured = X[measured]
    target = np.log(share)
    weight_measured = None if weight is None else np.asarray(weight)[measured]
    regressor = boosting.regressor(FEATURE_NAMES, seed, POWER_PARAMS)
    regressor.fit(boosting.trainable(X_measured, FEATURE_NAMES), target, sample_weight=weight_measured)
    residuals, levels, rows = _out_of_fold(X_measured, target, weight_measured, seed=seed)
    row_families = None if families is None else np.asarray(families)[measured][rows]
    scale, correlation = _error_structure(residuals, levels, row_families)
    return PowerUseModel(
        regressor, float(np.median(share)), sorted(set(gpus[measured])), scale, correlation,
        round(_spread(target), 4),
    )  # fmt: skip


def _out_of_fold(
    X: np.ndarray, target: np.ndarray, weight: np.ndarray | None, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Held-out residuals of log(watts / TDP), each one's novelty level in its fold's training rows, and
    its row number."""
    n = len(X)
    rng = np.random.default_rng(seed)
    random_part = rng.permutation(n) % RESIDUAL_PARTS
    block_part = np.arange(n) * RESIDUAL_PARTS // n
    folds = [random_part == 0] + [block_part == k for k in RESIDUAL_BLOCKS]
    residuals: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    for held_out in folds:
        train = np.flatnonzero(~held_out)
        if len(train) < MIN_POWER_RUNS or not held_out.any():
            continue
        if len(train) > RESIDUAL_MAX_TRAIN_ROWS:
            train = np.sort(rng.choice(train, RESIDUAL_MAX_TRAIN_ROWS, replace=False))
        residuals.append(held_out_residuals(X, target, weight, train, held_out, RESIDUAL_PARAMS, seed=seed))
        levels.append(levels_of(fold_neighbourhood(X[train], X[held_out])))
        rows.append(np.flatnonzero(held_out))
    if not residuals:
        return np.zeros(0), np.zeros(0, dtype=int), np.zeros(0, dtype=int)
    return np.concatenate(residuals), np.concatenate(levels), np.concatenate(rows)


def _error_structure(
    residuals: np.ndarray, levels: np.ndarray, families: np.ndarray | None
) -> tuple[dict[str, float], dict[str, float]]:
    """Per novelty level (from the surest to the least), the error's spread and the share a family shares;
    a level with too few residuals takes all of them, and neither figure falls below the level before's (a
    more novel configuration is never better known)."""
    scale: dict[str, float] = {}
    correlation: dict[str, float] = {}
    if len(residuals) < MIN_RESIDUALS_PER_LEVEL:
        return scale, correlation
    previous_scale, previous_share = 0.0, 0.0
    for level in LEVELS:
        mask = levels == level
        if mask.sum() < MIN_RESIDUALS_PER_LEVEL:
            mask = np.ones(len(residuals), dtype=bool)
        sigma = max(_spread(residuals[mask]), previous_scale)
        share = None
        if families is not None and sigma > 0:
            z = np.clip(residuals[mask] / sigma, -Z_CLIP, Z_CLIP)
            share = shared_share(z, families[mask])
        previous_scale = sigma
        previous_share = max(share if share is not None else previous_share, previous_share)
        scale[str(level)] = round(sigma, 4)
        correlation[str(level)] = round(previous_share, 4)
    return scale, correlation


def _spread(values: np.ndarray) -> float:
    """A standard deviation from the 10th-90th percentile range: the bulk's, not one odd run's."""
    if len(values) < 2:
        return 0.0
    low, high = np.quantile(values, [0.1, 0.9])
    return float((high - low) / (2 * Z90))
