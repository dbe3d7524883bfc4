"""The tree walker (calibrate/tree_walker.py): any estimator's trees walked from their arrays give
scikit-learn's raw scores (numeric and categorical splits, missing values, categories never seen), and
arrays a walk could leave or loop in are refused before a row is walked."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

from calibrate import native_trees, tree_walker
from calibrate.compiled import CompiledTrees
from calibrate.tree_walker import TreeArrays


def training_rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two numeric columns with missing values and a categorical one (codes 0..5)."""
    rng = np.random.default_rng(seed)
    n = 600
    X = np.column_stack([rng.normal(size=n), rng.normal(size=n), rng.integers(0, 6, size=n)]).astype(float)
    X[rng.random(n) < 0.1, 0] = np.nan
    y = X[:, 1] * 2 + np.where(np.isin(X[:, 2], [1, 4]), 3.0, -1.0) + np.nan_to_num(X[:, 0], nan=5.0)
    return X, y


def asked_rows(seed: int) -> np.ndarray:
    """Rows the trees never saw: missing values everywhere, a category outside the training codes."""
    X, _ = training_rows(seed + 100)
    X[::7, 1] = np.nan
    X[::5, 2] = 9.0
    X[::11, 2] = np.nan
    return X


@pytest.fixture(scope="module")
def walker() -> tree_walker.Walker:
    found = tree_walker.walker()
    if found is None:
        pytest.skip("no C compiler for the tree walker on this machine")
    return found


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_walk_gives_scikit_learns_raw_scores(walker: tree_walker.Walker, seed: int) -> None:
    X, y = training_rows(seed)
    regressor = HistGradientBoostingRegressor(max_iter=40, categorical_features=[2], random_state=seed).fit(
        X, y
    )
    classifier = HistGradientBoostingClassifier(max_iter=30, categorical_features=[2], random_state=seed).fit(
        X, y > np.median(y)
    )
    asked = asked_rows(seed)
    for estimator in (regressor, classifier):
        compiled = CompiledTrees(estimator)
        got = walker.raw(TreeArrays.from_estimator(estimator), compiled._in_tree_space(asked))
        want = estimator._raw_predict(asked).ravel()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_arrays_survive_a_round_trip(walker: tree_walker.Walker) -> None:
    X, y = training_rows(3)
    estimator = HistGradientBoostingRegressor(max_iter=20, categorical_features=[2]).fit(X, y)
    arrays = TreeArrays.from_estimator(estimator)
    back = TreeArrays.from_arrays(arrays.to_arrays("model"), "model")
    rows = CompiledTrees(estimator)._in_tree_space(asked_rows(3))
    assert np.array_equal(walker.raw(back, rows), walker.raw(arrays, rows))


def test_rows_of_another_width_are_refused(walker: tree_walker.Walker) -> None:
    X, y = training_rows(4)
    arrays = TreeArrays.from_estimator(HistGradientBoostingRegressor(max_iter=5).fit(X, y))
    with pytest.raises(ValueError, match="rows of 2 columns for trees of 3"):
        walker.raw(arrays, np.zeros((4, 2)))


def first_split(nodes: np.ndarray, kind: int = native_trees.NUMERIC) -> int:
    return int(np.flatnonzero(nodes["kind"] == kind)[0])


DAMAGE: dict[str, tuple[Callable[[dict[str, np.ndarray]], None], str]] = {
    "a child back at its parent": (
        lambda a: a["m.nodes"]["left"].__setitem__(first_split(a["m.nodes"]), 0),
        "left child outside its tree",
    ),
    "a child past its tree": (
        lambda a: a["m.nodes"]["right"].__setitem__(first_split(a["m.nodes"]), 10_000),
        "right child outside its tree",
    ),
    "a split on a column the rows lack": (
        lambda a: a["m.nodes"]["feature"].__setitem__(first_split(a["m.nodes"]), 3),
        "a column the rows do not have",
    ),
    "a bitset the table lacks": (
        lambda a: a["m.nodes"]["bitset"].__setitem__(
            first_split(a["m.nodes"], native_trees.CATEGORICAL), len(a["m.bitsets"])
        ),
        "without its bitset",
    ),
    "a node of no kind": (lambda a: a["m.nodes"]["kind"].__setitem__(0, 7), "no known kind"),
    "trees out of order": (lambda a: a["m.roots"].__setitem__(1, 0), "trees out of order"),
    "an infinite feature count": (lambda a: a["m.scalars"].__setitem__(1, np.inf), "out of range"),
    "a baseline that is no number": (lambda a: a["m.scalars"].__setitem__(0, np.nan), "out of range"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_arrays_a_walk_could_leave_are_refused(damage: str) -> None:
    X, y = training_rows(5)
    estimator = HistGradientBoostingRegressor(max_iter=10, categorical_features=[2]).fit(X, y)
    arrays = {k: v.copy() for k, v in TreeArrays.from_estimator(estimator).to_arrays("m").items()}
    change, message = DAMAGE[damage]
    change(arrays)
    with pytest.raises(ValueError, match=message):
        TreeArrays.from_arrays(arrays, "m")


def test_arrays_of_another_format_are_refused() -> None:
    X, y = training_rows(6)
    arrays = TreeArrays.from_estimator(HistGradientBoostingRegressor(max_iter=3).fit(X, y)).to_arrays("m")
    arrays["m.roots"] = arrays["m.roots"].astype(np.int32)
    with pytest.raises(ValueError, match="another format"):
        TreeArrays.from_arrays(arrays, "m")
