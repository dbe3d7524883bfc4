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
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import Pipeline

from calibrate.features import CATEGORICAL_FEATURES, FEATURE_NAMES
from calibrate.performance import make_pipeline

CLASSIFIER_PARAMS: dict[str, Any] = {
    "max_iter": 300,
    "learning_rate": 0.05,
    "max_leaf_nodes": 15,
    "min_samples_leaf": 10,
    "max_features": 0.5,
    "early_stopping": False,
}
MEMBERS = 3
VALID_THRESHOLD = 0.5  # p_valid at or above: predicted to run
_EPSILON = 1e-6


def make_classifier(seed: int) -> Pipeline:
    model = HistGradientBoostingClassifier(
        categorical_features=list(range(len(CATEGORICAL_FEATURES))), random_state=seed, **CLASSIFIER_PARAMS
    )
    return make_pipeline(model)


@dataclass
class RuntimeFailureModel:
    members: list[Pipeline]
    calibrators: list[LogisticRegression]  # one per member: logit(member's p) -> calibrated p

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        """p_valid per row."""
        X = features[list(FEATURE_NAMES)]
        calibrated = [
            calibrator.predict_proba(_logit(member.predict_proba(X)[:, 1]))[:, 1]
            for member, calibrator in zip(self.members, self.calibrators, strict=True)
        ]
        return np.mean(calibrated, axis=0)


def fit_failure(
    features: pd.DataFrame, ran: np.ndarray, weight: np.ndarray | None, *, seed: int
) -> RuntimeFailureModel:
    """Fit on rows that pass the admission rules; `ran` is True for valid runs, False for runtime failures."""
    ran = np.asarray(ran, dtype=bool)
    counts = np.bincount(ran.astype(int), minlength=2)
    if counts.min() < MEMBERS:
        raise ValueError(
            f"need at least {MEMBERS} valid runs and {MEMBERS} runtime failures to fit the failure model, "
            f"got {counts[1]} and {counts[0]}"
        )
    X = features[list(FEATURE_NAMES)]
    folds = StratifiedKFold(MEMBERS, shuffle=True, random_state=seed).split(np.zeros(len(ran)), ran)
    members: list[Pipeline] = []
    calibrators: list[LogisticRegression] = []
    for k, (train, held_out) in enumerate(folds):
        member = make_classifier(seed + k).fit(
            X.iloc[train], ran[train], boost__sample_weight=None if weight is None else weight[train]
        )
        scores = _logit(member.predict_proba(X.iloc[held_out])[:, 1])
        calibrator = LogisticRegression(C=100.0).fit(
            scores, ran[held_out], sample_weight=None if weight is None else weight[held_out]
        )
        members.append(member)
        calibrators.append(calibrator)
    return RuntimeFailureModel(members, calibrators)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPSILON, 1.0 - _EPSILON)
    return np.log(p / (1.0 - p)).reshape(-1, 1)
