"""The shortcuts a large batch takes (a CSV of 100,000 configurations), each giving the numbers the plain
path gives: rows walked in an order that puts alike configurations together (`calibrate.row_order`),
narrower neighbourhood keys hashed only where the wider one is known, and per-value work done once per
distinct value (`calibrate.loader.distinct_values`, through `calibrate.loader.factorize`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import performance as perf
from calibrate import row_order
from calibrate.encoding import FeatureEncoding
from calibrate.features import FEATURE_NAMES, feature_columns
from calibrate.fit import CalibratedModels
from calibrate.loader import DISTINCT_FROM_ROWS, distinct_values, factorize, load_benchmark


@pytest.fixture(scope="module")
def sample(sample_csv: Path) -> pd.DataFrame:
    return load_benchmark(sample_csv)


def test_alike_rows_are_put_together_by_their_names_then_their_sizes(sample: pd.DataFrame) -> None:
    columns, _ = feature_columns(sample)
    X = FeatureEncoding.fit(columns).matrix(columns)
    assert len(X) >= row_order.SORT_FROM_ROWS
    order = row_order.alike_together(X)
    assert order is not None
    assert np.array_equal(np.sort(order), np.arange(len(X)))  # a permutation
    assert not np.array_equal(order, np.arange(len(X)))  # the sample's own order is not this one
    keys = np.nan_to_num(X[order][:, row_order._KEY_COLUMNS], nan=-np.inf)
    # Each row's keys are at least its predecessor's, comparing key by key from the first.
    for previous, current in zip(keys[:-1], keys[1:], strict=True):
        differs = np.flatnonzero(previous != current)
        assert not len(differs) or previous[differs[0]] < current[differs[0]]
    assert row_order.alike_together(X[: row_order.SORT_FROM_ROWS - 1]) is None


def test_a_large_table_walked_in_that_order_gets_each_row_its_own_numbers(
    models: CalibratedModels, sample: pd.DataFrame
) -> None:
    """Predicted whole (sorted, then put back) and in chunks too small to be sorted: the same numbers, row
    for row. A prediction put back in the wrong place would land on another configuration's row."""
    table = sample.sample(frac=1.0, random_state=1).reset_index(drop=True)
    assert len(table) >= row_order.SORT_FROM_ROWS
    whole = models.predict_frame(table, power=True, distinct=True)
    step = row_order.SORT_FROM_ROWS // 2
    chunks = pd.concat(
        [models.predict_frame(table.iloc[i : i + step], power=True) for i in range(0, len(table), step)]
    )
    pd.testing.assert_frame_equal(whole, chunks)
    assert whole["tokens_per_second_p50"].nunique() > 100


def test_nested_keys_count_as_if_every_key_were_looked_up() -> None:
    """Training rows of some regions; asked: rows of seen regions with and without siblings, with and without
    their configuration, and rows of new regions."""
    rng = np.random.default_rng(5)
    train = rng.integers(0, 3, size=(600, len(FEATURE_NAMES))).astype(np.float64)
    asked = train[rng.integers(0, len(train), size=3000)].copy()
    asked[::3, perf._CONFIG_COLUMNS[-1]] += 10.0  # a seen sibling, a configuration never trained on
    asked[1::5, perf._SIBLING_COLUMNS[-1]] += 10.0  # a seen region's edge
    asked[2::7, perf._REGION_COLUMNS[0]] += 10.0  # a new region
    region, config, sibling = (
        perf._counts(perf.keys(train, c))
        for c in (perf._REGION_COLUMNS, perf._CONFIG_COLUMNS, perf._SIBLING_COLUMNS)
    )

    def every_key(columns: np.ndarray, rows: dict[str, int]) -> np.ndarray:
        return np.log1p(np.array([rows.get(k, 0) for k in perf.keys(asked, columns)], dtype=float))

    found = perf.neighbourhood(asked, region, config, sibling)
    seen_region = every_key(perf._REGION_COLUMNS, region) > 0
    expected = np.column_stack(
        [
            seen_region.astype(float),
            every_key(perf._REGION_COLUMNS, region),
            every_key(perf._CONFIG_COLUMNS, config),
            every_key(perf._SIBLING_COLUMNS, sibling),
        ]
    )
    assert np.array_equal(found, expected)
    levels = perf.levels_of(found)
    assert {perf.SEEN_REGION, perf.EDGE_REGION, perf.NEW_REGION} <= set(levels.tolist())
    assert (found[:, 2] > 0).sum() > 100 and (found[:, 2] == 0).sum() > 100
    # A version fitted before sibling counts: regions and configurations alone.
    assert np.array_equal(perf.neighbourhood(asked, region, config, None), expected[:, :3])


@pytest.mark.parametrize("rows", [7, DISTINCT_FROM_ROWS + 13])
def test_distinct_values_give_back_every_value_in_its_place(rows: int) -> None:
    pool = np.array(["a", " a", "b", None, np.nan, "c"], dtype=object)
    values = pool[np.random.default_rng(rows).integers(0, len(pool), size=rows)]
    codes, distinct = distinct_values(values)
    taken = distinct[codes]
    assert len(taken) == rows
    assert all(
        (t is v) or (t == v) or (pd.isna(t) and pd.isna(v) and type(t) is type(v))
        for t, v in zip(taken.tolist(), values.tolist(), strict=True)
    )
    if rows >= DISTINCT_FROM_ROWS:  # a large column: each distinct text once, each missing cell apart
        missing = pd.isna(values)
        assert len(distinct) == len(set(values[~missing].tolist())) + int(missing.sum())


@pytest.mark.parametrize(
    "values",
    [
        np.array(["b", "a", "b", "a long identifier " * 8, "b"], dtype=object),
        np.array(["a", None, "b", np.nan, "a", None], dtype=object),
        np.array([np.nan, "x", np.nan], dtype=object),
        np.array([1, 1.0, True, "1", None, pd.NA], dtype=object),
        np.array([], dtype=object),
        np.array([2.0, np.nan, -0.0, 0.0, 2.0]),
    ],
)
@pytest.mark.parametrize("missing_as_value", [False, True])
@pytest.mark.parametrize("pandas_table", [True, False], ids=["its table", "without it"])
def test_factorize_is_pandas_factorize(
    values: np.ndarray, missing_as_value: bool, pandas_table: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same with pandas' private hash table, and on a pandas without it (the fallback)."""
    from calibrate import loader

    assert loader._PyObjectHashTable is not None  # the pinned pandas has it: the fast path is what runs
    if not pandas_table:
        monkeypatch.setattr(loader, "_PyObjectHashTable", None)
    codes, distinct = factorize(values, missing_as_value=missing_as_value)
    expected_codes, expected = pd.factorize(values, use_na_sentinel=not missing_as_value)
    assert codes.dtype == expected_codes.dtype and np.array_equal(codes, expected_codes)
    assert len(distinct) == len(expected)
    assert all(
        (a is b) or (a == b and type(a) is type(b)) or (pd.isna(a) and pd.isna(b))
        for a, b in zip(distinct.tolist(), expected.tolist(), strict=True)
    )
