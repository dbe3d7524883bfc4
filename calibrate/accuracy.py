"""Accuracy metrics of the calibrated models, shared by `holdout_metrics`, the benches and the tests.

Errors are fractions (0.06 = 6 %). Throughput metrics are computed on valid runs only; the failure metrics on
rows that pass the admission rules (valid vs failed at runtime), as the paper separates the two.
"""

from __future__ import annotations

import warnings

import numpy as np

# scikit-learn's metrics are imported where they are computed: `calibrate.fit` imports this module, and a
# prediction from compiled trees runs without scikit-learn (1.2 s of imports a `finetwin predict`).


def absolute_percentage_errors(actual: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    actual = np.asarray(actual, dtype=float)
    predicted = np.asarray(predicted, dtype=float)
    if actual.shape != predicted.shape:
        raise ValueError(f"shapes differ: {actual.shape} vs {predicted.shape}")
    if np.any(actual <= 0):
        raise ValueError("actual throughput must be positive")
    return np.abs(predicted - actual) / actual


def mdape(actual: np.ndarray, predicted: np.ndarray) -> float:
    """Median absolute percentage error, as a fraction."""
    errors = absolute_percentage_errors(actual, predicted)
    return float(np.median(errors)) if errors.size else float("nan")


def mape(actual: np.ndarray, predicted: np.ndarray) -> float:
    """Mean absolute percentage error, as a fraction."""
    from sklearn.metrics import mean_absolute_percentage_error

    errors = absolute_percentage_errors(actual, predicted)  # checks the shapes and that actual > 0
    return float(mean_absolute_percentage_error(actual, predicted)) if errors.size else float("nan")


def band_coverage(actual: np.ndarray, low: np.ndarray, high: np.ndarray) -> float:
    """Share of actual values inside [low, high]."""
    actual = np.asarray(actual, dtype=float)
    if actual.size == 0:
        return float("nan")
    return float(np.mean((actual >= np.asarray(low)) & (actual <= np.asarray(high))))


def balanced_accuracy(actual: np.ndarray, predicted: np.ndarray) -> float:
    """Mean of the recalls of the two classes; with one class present, that class's recall."""
    from sklearn.metrics import balanced_accuracy_score

    actual = np.asarray(actual, dtype=bool)
    if actual.size == 0:
        return float("nan")
    with warnings.catch_warnings():
        # With one class in `actual` scikit-learn warns, and scores that class's recall, as meant here.
        warnings.simplefilter("ignore", UserWarning)
        return float(balanced_accuracy_score(actual, np.asarray(predicted, dtype=bool)))


def brier_score(actual: np.ndarray, probability: np.ndarray) -> float:
    """Mean squared error of a probability against the 0/1 outcome (lower is better)."""
    from sklearn.metrics import brier_score_loss

    actual = np.asarray(actual, dtype=float)
    if actual.size == 0:
        return float("nan")
    return float(brier_score_loss(actual, np.asarray(probability, dtype=float)))


def exact_share(expected: np.ndarray, predicted: np.ndarray) -> float:
    """Share of rows whose predicted label equals the expected one (None equals None)."""
    expected = np.asarray(expected, dtype=object)
    predicted = np.asarray(predicted, dtype=object)
    if expected.size == 0:
        return float("nan")
    same = [
        (e is None and p is None) or e == p for e, p in zip(_none(expected), _none(predicted), strict=True)
    ]
    return float(np.mean(same))


def _none(values: np.ndarray) -> list[object]:
    return [None if (v is None or (isinstance(v, float) and np.isnan(v))) else v for v in values]


def median_relative_width(low: np.ndarray, mid: np.ndarray, high: np.ndarray) -> float:
    """Median of (high - low) / mid: how sharp a band is, in units of its prediction."""
    mid = np.asarray(mid, dtype=float)
    width = (np.asarray(high, dtype=float) - np.asarray(low, dtype=float)) / mid
    return float(np.median(width)) if width.size else float("nan")


def interval_score(actual: np.ndarray, low: np.ndarray, high: np.ndarray, alpha: float = 0.2) -> float:
    """Mean Winkler interval score of central (1 - alpha) bands, relative to the actual value (so rows of
    any size weigh alike): width plus 2 / alpha times how far the actual value falls outside. Lower is
    better; it rewards a narrow band only where the band still holds the truth."""
    actual = np.asarray(actual, dtype=float)
    low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
    below = np.maximum(low - actual, 0.0)
    above = np.maximum(actual - high, 0.0)
    score = (high - low) + 2.0 / alpha * (below + above)
    return float(np.mean(score / actual)) if actual.size else float("nan")
