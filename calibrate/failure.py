"""The runtime-failure model: the probability that a configuration that passes the admission rules runs
without failing (out of memory, illegal memory access), `p_valid`.

The admission rules themselves are not learned: `twin.domain.broken_rule` applies them exactly. This model
sees only rows that pass them.

Gradient-boosted trees on the memory physics of `calibrate.features` (state, activations and logits per GPU
against its memory), cross-fitted: each of a few members is trained on all folds but one and calibrated
(Platt scaling) on the fold it did not see; `p_valid` is the mean of the calibrated members. That gives
calibrated probabilities without a separate calibration set and smooths the trees a little.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

from calibrate import boosting
from calibrate.compiled import CompiledTrees
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
_MEMORY_COLUMNS = columns(MEMORY_FEATURES)


@dataclass
class RuntimeFailureModel:
    members: list[HistGradientBoostingClassifier]
    calibrators: list[LogisticRegression]  # one per member: logit(member's p) -> calibrated p

    def __post_init__(self) -> None:
        self._compiled = [CompiledTrees(member) for member in self.members]
        # Platt scaling is one logistic function: its two numbers, not a scikit-learn call per member.
        self._platt = [(float(c.coef_[0, 0]), float(c.intercept_[0])) for c in self.calibrators]

    def predict(self, X: np.ndarray, *, reference: bool = False) -> np.ndarray:
        """p_valid per row of the encoded feature matrix. `reference`: through scikit-learn instead of the
        compiled trees and the closed-form calibration (the same numbers, slower)."""
        return np.mean(self.member_predictions(X, reference=reference), axis=0)

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
    X: np.ndarray, ran: np.ndarray, weight: np.ndarray | None, *, seed: int
) -> RuntimeFailureModel:
    """Fit on rows (of the encoded feature matrix) that pass the admission rules; `ran` is True for valid
    runs, False for runtime failures."""
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
        members.append(member)
        calibrators.append(calibrator)
    return RuntimeFailureModel(members, calibrators)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPSILON, 1.0 - _EPSILON)
    return np.log(p / (1.0 - p)).reshape(-1, 1)
