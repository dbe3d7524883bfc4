"""The gradient-boosted estimators the three models share: scikit-learn's HistGradientBoosting, fed the
feature frame of `calibrate.features` directly, with native splits on the categorical features (an unseen
category is treated as missing).

Only scikit-learn types, so that a fitted estimator can be stored with skops (see `SKOPS_TRUSTED_TYPES`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from calibrate.features import CATEGORICAL_FEATURES

# Types inside these estimators that skops does not trust by default, all scikit-learn's own: the fitted
# trees and the input check HistGradientBoosting keeps for categorical features (a partial of check_array).
SKOPS_TRUSTED_TYPES: tuple[str, ...] = (
    "functools.partial",
    "sklearn.ensemble._hist_gradient_boosting.predictor.TreePredictor",
    "sklearn.utils.validation.check_array",
)


def regressor(features: Sequence[str], seed: int, params: dict[str, Any]) -> HistGradientBoostingRegressor:
    return HistGradientBoostingRegressor(
        categorical_features=_categories(features), random_state=seed, **params
    )


def classifier(features: Sequence[str], seed: int, params: dict[str, Any]) -> HistGradientBoostingClassifier:
    return HistGradientBoostingClassifier(
        categorical_features=_categories(features), random_state=seed, **params
    )


def trainable(X: pd.DataFrame) -> pd.DataFrame:
    """Training rows with every all-missing numeric column set to 0: the trees' binning fails on a column
    with no value at all, and a constant column is never split on (prediction rows keep their NaN)."""
    empty = [c for c in X.columns if c not in CATEGORICAL_FEATURES and X[c].isna().all()]
    return X.assign(**{c: 0.0 for c in empty}) if empty else X


def _categories(features: Sequence[str]) -> list[str]:
    return [f for f in features if f in CATEGORICAL_FEATURES]
