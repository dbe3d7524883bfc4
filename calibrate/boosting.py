"""The gradient-boosted estimators the three models share: scikit-learn's HistGradientBoosting, fed columns
of the numeric matrix of `calibrate.encoding`, with native splits on the categorical features' codes (an
unseen category is treated as missing).

Only scikit-learn types, so that a fitted estimator can be stored with skops (see `SKOPS_TRUSTED_TYPES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from calibrate.features import CATEGORICAL_FEATURES

if TYPE_CHECKING:  # imported where a model is fitted: predicting from compiled trees never needs them
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

# Types inside these estimators that skops does not trust by default, all scikit-learn's own: the fitted
# trees and the input check HistGradientBoosting keeps for categorical features (a partial of check_array).
SKOPS_TRUSTED_TYPES: tuple[str, ...] = (
    "functools.partial",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.utils.validation.check_array",
)


def regressor(features: Sequence[str], seed: int, params: dict[str, Any]) -> HistGradientBoostingRegressor:
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(
        categorical_features=_categories(features), random_state=seed, **params
    )


def classifier(features: Sequence[str], seed: int, params: dict[str, Any]) -> HistGradientBoostingClassifier:
    from sklearn.ensemble import HistGradientBoostingClassifier

    return HistGradientBoostingClassifier(
        categorical_features=_categories(features), random_state=seed, **params
    )


def trainable(X: np.ndarray, features: Sequence[str]) -> np.ndarray:
    """Training rows with every all-missing numeric column set to 0: the trees' binning fails on a column
    with no value at all, and a constant column is never split on (prediction rows keep their NaN)."""
    empty = [
        j for j, name in enumerate(features) if name not in CATEGORICAL_FEATURES and np.isnan(X[:, j]).all()
    ]
    if not empty:
        return X
    X = X.copy()
    X[:, empty] = 0.0
    return X


def _categories(features: Sequence[str]) -> np.ndarray:
    return np.array([f in CATEGORICAL_FEATURES for f in features], dtype=bool)
