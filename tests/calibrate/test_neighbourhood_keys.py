"""`calibrate.performance.keys` (one key per distinct row of the key columns, whatever the batch) and the
encoding's category codes, both computed once per distinct value."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.encoding import FeatureEncoding
from calibrate.features import CATEGORICAL_FEATURES, FEATURE_NAMES
from calibrate.performance import _CONFIG_COLUMNS, _REGION_COLUMNS, HASH_EACH_ROW_BELOW, keys


def _matrix(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # Few values per column, so that many rows repeat a region or a configuration.
    return rng.integers(0, 3, size=(rows, len(FEATURE_NAMES))).astype(np.float64) / 7.0


# Below HASH_EACH_ROW_BELOW every row is hashed; above, equal rows are grouped first and hashed once.
BATCH_SIZES = (400, 2 * HASH_EACH_ROW_BELOW + 500)


@pytest.mark.parametrize("rows", BATCH_SIZES)
def test_rows_share_a_key_exactly_when_their_key_columns_are_equal(rows: int) -> None:
    X = _matrix(rows, seed=1)
    X[5, _REGION_COLUMNS[0]] = np.nan  # missing counts as its own value
    X[6, _REGION_COLUMNS] = X[7, _REGION_COLUMNS]
    X[6, _REGION_COLUMNS[1]] = -0.0  # -0.0 and 0.0 are one value
    X[7, _REGION_COLUMNS[1]] = 0.0
    for columns in (_REGION_COLUMNS, _CONFIG_COLUMNS):
        found = keys(X, columns)
        rounded = np.nan_to_num(np.round(X[:, columns], 3), nan=-1.0) + 0.0
        same_rows = (rounded[:, None, :] == rounded[None, :, :]).all(axis=2)
        assert np.array_equal(found[:, None] == found[None, :], same_rows)
        assert len(set(found)) > 1


def test_a_row_keeps_its_key_in_any_batch() -> None:
    X = _matrix(300, seed=2)
    whole = keys(X, _CONFIG_COLUMNS)
    order = np.random.default_rng(3).permutation(len(X))
    assert np.array_equal(keys(X[order], _CONFIG_COLUMNS), whole[order])
    assert np.array_equal(keys(X[:1], _CONFIG_COLUMNS), whole[:1])
    assert len(keys(X[:0], _CONFIG_COLUMNS)) == 0


def test_a_large_batch_gives_each_row_the_key_it_has_alone() -> None:
    """The grouped path (a CSV's rows) and the per-row path (an answer's) agree: the keys stored at fit
    time are looked up from both."""
    rng = np.random.default_rng(4)
    X = _matrix(300, seed=4)[rng.integers(0, 300, size=BATCH_SIZES[1])]  # rows repeat
    X[::7, _CONFIG_COLUMNS[2]] = rng.normal(size=len(X[::7]))  # many distinct rows too
    X[3, _CONFIG_COLUMNS[0]] = np.nan
    batch = keys(X, _CONFIG_COLUMNS)
    alone = np.concatenate([keys(X[i : i + 100], _CONFIG_COLUMNS) for i in range(0, len(X), 100)])
    assert np.array_equal(batch, alone)
    assert 100 < len(set(batch)) < len(X)


def test_codes_of_unseen_and_known_categories() -> None:
    name = CATEGORICAL_FEATURES[0]
    encoding = FeatureEncoding({n: ("a", "b") if n == name else ("x",) for n in CATEGORICAL_FEATURES})
    codes = encoding._codes(name, np.array(["b", "zz", "a", "b", None], dtype=object))
    assert np.array_equal(codes, [1.0, np.nan, 0.0, 1.0, np.nan], equal_nan=True)
