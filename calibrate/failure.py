"""The runtime-failure model: the probability that a configuration that passes the admission rules runs
without failing (out of memory, illegal memory access), `p_valid`.

The admission rules themselves are not learned: `twin.domain.broken_rule` applies them exactly. This model
sees only rows that pass them.

Gradient-boosted trees on the memory physics of `calibrate.features` (state, activations and logits per GPU
against its memory), cross-fitted: each of a few members is trained on all folds but one and calibrated
(Platt scaling) on the fold it did not see; `p_valid` is the mean of the calibrated members. That gives
calibrated probabilities without a separate calibration set and smooths the trees a little.

`p_valid_low` is a lower bound on the chance to run, for advice an operator can follow (issue 14): the
weakest member's p_valid, mapped through a bound calibrated on out-of-fold data. Every row is held out from
exactly one member; its calibrated prediction there is binned, and each bin's share of rows that ran gets its
one-sided Clopper-Pearson lower bound (95 %). The bound's knots are made monotone (a higher prediction never
gets a lower bound) and the result is capped at the point estimate.

`error_correlation` is how much of the model's error an error family (`twin.families`) shares, for the twin's
ensembles (issue 12): failures are not independent coin flips when the model misjudges the memory of a whole
model, method and GPU. It is the intra-family correlation of the standardized out-of-fold residuals
(ran - p) / sqrt(p (1 - p)), measured by `calibrate.correlation.shared_share` as for throughput.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import beta
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from calibrate import boosting
from calibrate.compiled import CompiledTrees
from calibrate.correlation import Z_CLIP, shared_share
from calibrate.encoding import columns
from calibrate.features import MEMORY_FEATURES

# A random 30 % of the features at each split: with many overlapping memory features, it keeps the trees
# from leaning on one proxy (better balanced accuracy on unseen blocks of the benchmark).
CLASSIFIER_PARAMS: dict[str, Any] = {
    "max_iter": 100,
    "learning_rate": 0.15,
    "max_leaf_nodes": 15,
    "min_samples_leaf": 10,
    "max_features": 0.3,
    "early_stopping": False,
}
MEMBERS = 4
# Each member trains on at most this many rows (a different random subset each), which bounds the fit time
# on the full benchmark; together the members still see most rows.
MEMBER_MAX_TRAIN_ROWS = 8000
VALID_THRESHOLD = 0.5  # p_valid at or above: predicted to run
_EPSILON = 1e-6
# The lower bound: one-sided confidence of each bin's Clopper-Pearson bound, and rows per bin (enough rows
# that a bin of all-valid runs earns a bound near its prediction, few enough to follow the curve).
LOWER_BOUND_CONFIDENCE = 0.95
LOWER_BOUND_BIN_ROWS = 200
# Residuals of predictions this sure are not standardized beyond it: a 1-in-1000 surprise is one surprise,
# not evidence that a whole family is misjudged.
_RESIDUAL_P_FLOOR = 0.02
_MEMORY_COLUMNS = columns(MEMORY_FEATURES)


@dataclass
class RuntimeFailureModel:
    members: list[HistGradientBoostingClassifier]
    calibrators: list[LogisticRegression]  # one per member: logit(member's p) -> calibrated p
    # (predicted p, lower bound) knots fitted on out-of-fold predictions; None for models saved before them,
    # which then bound by the weakest member alone.
    lower_bound: tuple[list[float], list[float]] | None = None
    # Share of the (standardized) error shared within an error family; 0: independent (older versions).
    error_correlation: float = 0.0

    def __post_init__(self) -> None:
        self._compiled = [CompiledTrees(member) for member in self.members]
        # Platt scaling is one logistic function: its two numbers, not a scikit-learn call per member.
        self._platt = [(float(c.coef_[0, 0]), float(c.intercept_[0])) for c in self.calibrators]

    def predict(self, X: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """p_valid per row of the encoded feature matrix. `reference`: through scikit-learn instead of the
        compiled trees and the closed-form calibration (the same numbers, slower)."""
        return np.mean(self.member_predictions(X, reference=reference), axis=0)

    def predict_with_low(self, X: np.ndarray, *, reference: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(p_valid, p_valid_low) per row; p_valid_low <= p_valid."""
        members = self.member_predictions(X, reference=reference)
        point = np.mean(members, axis=0) if len(members) else np.zeros(0)
        weakest = np.min(members, axis=0) if members.size else np.zeros(0)
        if self.lower_bound is not None:
            knots_p, knots_low = self.lower_bound
            weakest = np.interp(weakest, knots_p, knots_low)
        return point, np.minimum(weakest, point)

    def member_predictions(self, X: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """(members, n) calibrated p_valid of each member."""
        if len(X) == 0:
            return np.zeros((len(self.members), 0))
        X = X[:, _MEMORY_COLUMNS]
        if reference:
            return np.array(
                [
                    calibrator.predict_proba(_logit(member.predict_proba(X)[:, 1]))[:, 1]
                    for member, calibrator in zip(self.members, self.calibrators, strict=True)
                ]
            )
        return np.array(
            [
                _sigmoid(slope * _logit(trees.predict(X))[:, 0] + intercept)
                for trees, (slope, intercept) in zip(self._compiled, self._platt, strict=True)
            ]
        )


def fit_failure(
    X: np.ndarray, ran: np.ndarray, weight: np.ndarray | None, *, seed: int,
    families: np.ndarray | None = None,
) -> RuntimeFailureModel:  # fmt: skip
    """Fit on rows (of the encoded feature matrix) that pass the admission rules; `ran` is True for valid
    runs, False for runtime failures; `families`, each row's error family (to measure shared error)."""
    ran = np.asarray(ran, dtype=bool)
    counts = np.bincount(ran.astype(int), minlength=2)
    if counts.min() < MEMBERS:
        raise ValueError(
            f"need at least {MEMBERS} valid runs and {MEMBERS} runtime failures to fit the failure model, "
            f"got {counts[1]} and {counts[0]}"
        )
    X = X[:, _MEMORY_COLUMNS]
    folds = StratifiedKFold(MEMBERS, shuffle=True, random_state=seed).split(np.zeros(len(ran)), ran)
    members: list[HistGradientBoostingClassifier] = []
    calibrators: list[LogisticRegression] = []
    out_of_fold = np.full(len(ran), np.nan)
    rng = np.random.default_rng(seed)
    for k, (train, held_out) in enumerate(folds):
        if len(train) > MEMBER_MAX_TRAIN_ROWS:
            train = np.sort(rng.choice(train, MEMBER_MAX_TRAIN_ROWS, replace=False))
        member = boosting.classifier(MEMORY_FEATURES, seed + k, CLASSIFIER_PARAMS)
        member.fit(
            boosting.trainable(X[train], MEMORY_FEATURES),
            ran[train],
            sample_weight=None if weight is None else weight[train],
        )
        scores = _logit(member.predict_proba(X[held_out])[:, 1])
        calibrator = LogisticRegression(C=100.0).fit(
            scores, ran[held_out], sample_weight=None if weight is None else weight[held_out]
        )
        out_of_fold[held_out] = calibrator.predict_proba(scores)[:, 1]
        members.append(member)
        calibrators.append(calibrator)
    correlation = failure_error_correlation(out_of_fold, ran, families) if families is not None else 0.0
    return RuntimeFailureModel(members, calibrators, fit_lower_bound(out_of_fold, ran), correlation)


def failure_error_correlation(predicted: np.ndarray, ran: np.ndarray, families: np.ndarray) -> float:
    """The intra-family correlation of standardized out-of-fold residuals (0 with too few families)."""
    p = np.clip(np.asarray(predicted, dtype=float), _RESIDUAL_P_FLOOR, 1.0 - _RESIDUAL_P_FLOOR)
    z = np.clip((np.asarray(ran, dtype=float) - p) / np.sqrt(p * (1.0 - p)), -Z_CLIP, Z_CLIP)
    share = shared_share(z, np.asarray(families))
    return round(float(share), 4) if share is not None else 0.0


def fit_lower_bound(
    predicted: np.ndarray, ran: np.ndarray, *, bin_rows: int = LOWER_BOUND_BIN_ROWS
) -> tuple[list[float], list[float]]:
    """Knots (predicted p, lower bound on the share that ran) from out-of-fold predictions: bins of
    `bin_rows` rows by predicted p, each bin's one-sided Clopper-Pearson lower bound, monotone."""
    order = np.argsort(predicted, kind="stable")
    p, ok = np.asarray(predicted, dtype=float)[order], np.asarray(ran, dtype=bool)[order]
    n_bins = max(1, len(p) // bin_rows)
    knots_p: list[float] = []
    knots_low: list[float] = []
    for chunk_p, chunk_ok in zip(np.array_split(p, n_bins), np.array_split(ok, n_bins), strict=True):
        k, n = int(chunk_ok.sum()), len(chunk_ok)
        low = float(beta.ppf(1 - LOWER_BOUND_CONFIDENCE, k, n - k + 1)) if k > 0 else 0.0
        knots_p.append(float(chunk_p.mean()))
        knots_low.append(low)
    # Monotone and conservative: a bin's bound is the least of its own and every bin above it.
    monotone = np.minimum.accumulate(np.asarray(knots_low)[::-1])[::-1]
    return [0.0, *knots_p, 1.0], [0.0, *map(float, monotone), float(monotone[-1])]


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPSILON, 1.0 - _EPSILON)
    return np.log(p / (1.0 - p)).reshape(-1, 1)
