"""The throughput model: whole-job `dataset_tokens_per_second` with a p10-p90 band.

A gradient-boosted regressor learns log(tokens/s) minus the physics bound of `calibrate.features`
(`log_physics_tokens_per_second`): an efficiency, which carries over to model sizes and GPU counts the
benchmark never ran, where a model of raw names would be lost.

The band comes from out-of-fold residuals (split conformal), kept apart by whether the training rows hold the
configuration's region (the same model under the same protocol) or not. The out-of-fold rows come from
random folds and from contiguous blocks of the table, so a new region gets the wider residuals of
configuration regions the model had not seen.

The same out-of-fold residuals say how much of the error the rows of one error family share, and how the
error is distributed in units of the band (`calibrate.correlation`, per novelty level): the twin's ensembles
draw the shared share once per family and run, and read each job's error from that distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtri
from sklearn.ensemble import HistGradientBoostingRegressor

from calibrate import boosting
from calibrate.correlation import error_quantiles, shared_share, standardize
from calibrate.features import FEATURE_NAMES, THROUGHPUT_OFFSET
from twin.families import ERROR_QUANTILE_LEVELS

# Shallow trees on a random half of the features at each split: the physics features carry most of the
# signal, and the block cross-validation (unseen configuration regions) prefers the smoother fit.
REGRESSOR_PARAMS: dict[str, Any] = {
    "max_iter": 500,
    "learning_rate": 0.05,
    "max_leaf_nodes": 15,
    "min_samples_leaf": 10,
    "max_features": 0.5,
    "early_stopping": False,
}
# The out-of-fold fits only estimate residuals: the same trees, fewer and larger steps.
RESIDUAL_PARAMS: dict[str, Any] = REGRESSOR_PARAMS | {"max_iter": 100, "learning_rate": 0.2}
# The residuals come from a few folds of a split of the rows into RESIDUAL_PARTS parts: random parts, and
# contiguous blocks spread over the table (each fold holds out one part, so its model sees most rows).
RESIDUAL_PARTS = 6
RANDOM_FOLDS = 2
BLOCK_FOLDS = 3
# Each out-of-fold fit sees at most this many rows, so the band costs the same on the full benchmark as on
# the sample (on 30,920 rows the band is then slightly conservative).
RESIDUAL_MAX_TRAIN_ROWS = 4000
BAND_QUANTILES = (0.10, 0.90)
# Novel configurations take a wider nominal band: the held-out blocks of one table are less novel than the
# regions a prediction meets later, so their residuals understate the error there.
NOVEL_BAND_QUANTILES = (0.05, 0.95)
MIN_RESIDUALS_PER_LEVEL = 30

# Whether the training rows hold the configuration's region: the same model under the same protocol (tuning
# stack, method, GPU, time cap, nodes, RoCE). A model new to a protocol and a new protocol are pooled: the
# benchmark has too few rows of the first kind to size a band of its own.
SEEN_REGION, NEW_REGION = 0, 1
_REGION_KEY = (
    "method",
    "gpu_model",
    "protocol",
    "tuning_version",
    "time_limited",
    "multi_node",
    "enable_roce",
    "model_family",
)


@dataclass
class ThroughputModel:
    regressor: HistGradientBoostingRegressor
    band: dict[str, list[float]]  # level -> [low, high] offsets of log(tokens/s) from the prediction
    seen_regions: list[str]
    # level -> share of the (standardized) error shared within an error family (twin.families)
    error_correlation: dict[str, float] = field(default_factory=dict)
    # level -> the standardized error at twin.families.ERROR_QUANTILE_LEVELS (absent: a normal's)
    error_quantiles: dict[str, list[float]] = field(default_factory=dict)

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        """(n, 3) tokens/s: p10, p50, p90."""
        center = (
            self.regressor.predict(features[list(FEATURE_NAMES)]) + features[THROUGHPUT_OFFSET].to_numpy()
        )
        levels = novelty_levels(features, set(self.seen_regions))
        low = np.array([self.band[str(level)][0] for level in levels])
        high = np.array([self.band[str(level)][1] for level in levels])
        return np.exp(np.column_stack([center + low, center, center + high]))

    def predict_error_correlation(self, features: pd.DataFrame) -> np.ndarray:
        """(n,) the share of each row's error its error family shares (0 for versions fitted before it was
        measured: independent errors, as the twin assumed then)."""
        levels = novelty_levels(features, set(self.seen_regions))
        return np.array([self.error_correlation.get(str(level), 0.0) for level in levels], dtype=float)

    def predict_error_quantiles(self, features: pd.DataFrame) -> np.ndarray:
        """(n, levels) each row's standardized error at ERROR_QUANTILE_LEVELS (a normal's where its level's
        distribution was not measured)."""
        levels = novelty_levels(features, set(self.seen_regions))
        normal = ndtri(ERROR_QUANTILE_LEVELS)
        tables = {key: np.asarray(value, dtype=float) for key, value in self.error_quantiles.items()}
        return np.array([tables.get(str(level), normal) for level in levels]).reshape(len(levels), -1)

    def params(self) -> dict[str, Any]:
        return {
            "band": self.band,
            "seen_regions": self.seen_regions,
            "error_correlation": self.error_correlation,
            "error_quantiles": self.error_quantiles,
        }

    @classmethod
    def from_params(cls, regressor: HistGradientBoostingRegressor, params: dict[str, Any]) -> ThroughputModel:
        correlation = {str(k): float(v) for k, v in (params.get("error_correlation") or {}).items()}
        quantiles = {str(k): [float(x) for x in v] for k, v in (params.get("error_quantiles") or {}).items()}
        return cls(regressor, params["band"], list(params["seen_regions"]), correlation, quantiles)


def fit_throughput(
    features: pd.DataFrame,
    tokens_per_second: np.ndarray,
    weight: np.ndarray | None,
    *,
    seed: int,
    families: np.ndarray | None = None,
) -> ThroughputModel:
    """Fit on valid runs: `features` rows and their measured tokens/s (positive); `families`, each row's
    error family (`twin.families`), to measure how much error a family shares."""
    if len(features) < 10:
        raise ValueError(f"need at least 10 valid runs to fit throughput, got {len(features)}")
    target = np.log(tokens_per_second) - features[THROUGHPUT_OFFSET].to_numpy()
    X = features[list(FEATURE_NAMES)]
    regressor = boosting.regressor(FEATURE_NAMES, seed, REGRESSOR_PARAMS)
    regressor.fit(boosting.trainable(X), target, sample_weight=weight)
    residuals, levels, from_blocks, rows = _out_of_fold_residuals(features, target, weight, seed=seed)
    band = _band(residuals, levels, from_blocks)
    row_families = np.asarray(families)[rows] if families is not None else None
    correlation, quantiles = _error_structure(residuals, levels, from_blocks, row_families, band)
    return ThroughputModel(regressor, band, sorted(set(region_keys(features))), correlation, quantiles)


def _error_structure(
    residuals: np.ndarray,
    levels: np.ndarray,
    from_blocks: np.ndarray,
    families: np.ndarray | None,
    band: dict[str, list[float]],
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per novelty level, from the residuals the level's band came from: the share of error a family
    shares (a level without enough families takes the other's; seen: 0 when neither has), and the
    distribution of the error in band units."""
    seen = levels == SEEN_REGION
    pools = {SEEN_REGION: seen & ~from_blocks, NEW_REGION: ~seen}
    shares: dict[str, float | None] = {}
    quantiles: dict[str, list[float]] = {}
    for level, mask in pools.items():
        low, high = band[str(level)]
        raw = standardize(residuals[mask], np.full(mask.sum(), low), np.full(mask.sum(), high), clip=None)
        table = error_quantiles(raw)
        if table is not None:
            quantiles[str(level)] = [round(float(x), 4) for x in table]
        clipped = standardize(residuals[mask], np.full(mask.sum(), low), np.full(mask.sum(), high))
        shares[str(level)] = shared_share(clipped, families[mask]) if families is not None else None
    if families is None:
        return {}, quantiles
    seen_share = shares[str(SEEN_REGION)]
    new_share = shares[str(NEW_REGION)]
    seen_value = seen_share if seen_share is not None else 0.0
    # An unseen family never shares less error than a seen one (the model learned nothing about it).
    new_value = max(new_share if new_share is not None else seen_value, seen_value)
    correlation = {str(SEEN_REGION): round(seen_value, 4), str(NEW_REGION): round(new_value, 4)}
    return correlation, quantiles


def region_keys(features: pd.DataFrame) -> np.ndarray:
    """The region of each row: its protocol and its model (family and size)."""
    key = features[_REGION_KEY[0]].astype(str)
    for column in _REGION_KEY[1:]:
        key = key + "|" + features[column].astype(str)
    return (key + "|" + features["log_params"].round(3).astype(str)).to_numpy()


def novelty_levels(features: pd.DataFrame, seen_regions: set[str]) -> np.ndarray:
    seen = np.array([key in seen_regions for key in region_keys(features)], dtype=bool)
    return np.where(seen, SEEN_REGION, NEW_REGION)


def _out_of_fold_residuals(
    features: pd.DataFrame, target: np.ndarray, weight: np.ndarray | None, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Residuals of log(tokens/s), each row's novelty level, whether it was held out in a block, and its
    position in `features`."""
    n = len(features)
    rng = np.random.default_rng(seed)
    random_part = rng.permutation(n) % RESIDUAL_PARTS
    block_part = np.arange(n) * RESIDUAL_PARTS // n
    spread = np.linspace(0, RESIDUAL_PARTS - 1, BLOCK_FOLDS).round().astype(int)
    folds = [(random_part == k, False) for k in range(RANDOM_FOLDS)] + [
        (block_part == k, True) for k in spread
    ]
    X = features[list(FEATURE_NAMES)]
    residuals: list[np.ndarray] = []
    levels: list[np.ndarray] = []
    from_blocks: list[np.ndarray] = []
    rows: list[np.ndarray] = []
    for held_out, is_block in folds:
        train = ~held_out
        if train.sum() < 10 or held_out.sum() == 0:
            continue
        if train.sum() > RESIDUAL_MAX_TRAIN_ROWS:
            keep = rng.choice(np.flatnonzero(train), RESIDUAL_MAX_TRAIN_ROWS, replace=False)
            train = np.zeros(n, dtype=bool)
            train[keep] = True
        model = boosting.regressor(FEATURE_NAMES, seed, RESIDUAL_PARAMS)
        model.fit(
            boosting.trainable(X[train]),
            target[train],
            sample_weight=None if weight is None else weight[train],
        )
        residuals.append(target[held_out] - model.predict(X[held_out]))
        levels.append(novelty_levels(features[held_out], set(region_keys(features[train]))))
        from_blocks.append(np.full(int(held_out.sum()), is_block))
        rows.append(np.flatnonzero(held_out))
    return (
        np.concatenate(residuals),
        np.concatenate(levels),
        np.concatenate(from_blocks),
        np.concatenate(rows),
    )


def _band(residuals: np.ndarray, levels: np.ndarray, from_blocks: np.ndarray) -> dict[str, list[float]]:
    """Residual quantiles per novelty level, as [low, high] offsets that contain 0 (the prediction).

    A seen region takes its band from the random folds alone: a held-out block makes even its seen rows'
    neighbourhood sparser than any prediction from the full table will be. A level with too few residuals
    borrows all of them, and a new region's band is never narrower than a seen one's.
    """
    seen = levels == SEEN_REGION
    pools = {
        SEEN_REGION: (residuals[seen & ~from_blocks], residuals[seen], BAND_QUANTILES),
        NEW_REGION: (residuals[~seen], residuals[~seen], NOVEL_BAND_QUANTILES),
    }
    band: dict[str, list[float]] = {}
    previous = [0.0, 0.0]
    for level, (preferred, fallback, quantiles) in pools.items():
        chosen = next((p for p in (preferred, fallback) if p.size >= MIN_RESIDUALS_PER_LEVEL), residuals)
        low, high = (float(q) for q in np.quantile(chosen, quantiles))
        band[str(level)] = previous = [min(low, previous[0]), max(high, previous[1])]
    return band
