"""The numeric encoding of the features, fixed when the models are fitted: every model reads one float
matrix (FEATURE_NAMES order) in which a categorical feature holds its category's code in the list the fit
saw, and NaN for a category the fit never saw (the trees send it where they send a missing value).

Fitting and predicting both go through `FeatureEncoding.matrix`, so the codes a tree splits on are the codes
it is asked about; the lists are saved with the model version (JSON, in `params.json`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibrate.features import CATEGORICAL_FEATURES, FEATURE_NAMES
from calibrate.loader import distinct_values

# HistGradientBoosting takes at most 255 categories per feature; the rarest beyond this count as unseen.
MAX_CATEGORIES = 250
CATEGORICAL_MASK: np.ndarray = np.array([name in CATEGORICAL_FEATURES for name in FEATURE_NAMES])


def column(name: str) -> int:
    """The matrix column of a feature."""
    return FEATURE_NAMES.index(name)


def columns(names: Sequence[str]) -> np.ndarray:
    return np.array([column(name) for name in names], dtype=np.intp)


@dataclass(frozen=True)
class FeatureEncoding:
    categories: dict[str, tuple[str, ...]]  # per categorical feature, the category of each code

    @classmethod
    def fit(cls, features: Mapping[str, np.ndarray]) -> FeatureEncoding:
        """The categories of the training rows, most frequent first (ties by name, so a fit is repeatable)."""
        found: dict[str, tuple[str, ...]] = {}
        for name in CATEGORICAL_FEATURES:
            values, counts = np.unique(np.asarray(features[name]).astype(str), return_counts=True)
            order = sorted(range(len(values)), key=lambda i: (-counts[i], values[i]))[:MAX_CATEGORIES]
            found[name] = tuple(str(values[i]) for i in order)
        return cls(found)

    def matrix(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """(rows, FEATURE_NAMES) float64: numeric features as they are, categorical ones as codes."""
        n = len(features[FEATURE_NAMES[0]])
        out = np.empty((n, len(FEATURE_NAMES)), dtype=np.float64)
        for j, name in enumerate(FEATURE_NAMES):
            if name in self.categories:
                out[:, j] = self._codes(name, features[name])
            else:
                out[:, j] = np.asarray(features[name], dtype=np.float64)
        return out

    def _codes(self, name: str, values: Any) -> np.ndarray:
        # Each distinct value looked up once: a 100,000-row CSV holds a few dozen per feature. Found by
        # hashing, not by np.unique over texts (which sorted them: ~12 ms a feature on 100,000 rows).
        codes, distinct = distinct_values(values)
        index = self._index(name)
        table = np.array([index.get(str(v), np.nan) for v in distinct], dtype=np.float64)
        return table[codes]

    def _index(self, name: str) -> dict[str, float]:
        cache = self.__dict__.setdefault("_indexes", {})
        if name not in cache:
            cache[name] = {category: float(code) for code, category in enumerate(self.categories[name])}
        return cache[name]

    def params(self) -> dict[str, list[str]]:
        return {name: list(values) for name, values in self.categories.items()}

    @classmethod
    def from_params(cls, params: Mapping[str, Sequence[str]]) -> FeatureEncoding:
        if set(params) != set(CATEGORICAL_FEATURES):
            raise ValueError(
                "the stored feature encoding names other categorical features than this finetwin's"
            )
        return cls({name: tuple(str(v) for v in params[name]) for name in CATEGORICAL_FEATURES})
