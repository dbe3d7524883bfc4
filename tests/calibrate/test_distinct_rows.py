"""A large table is predicted once per distinct configuration (calibrate.fit.predict_columns): the same
numbers as row by row, and a bad cell still named by its row in the whole table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import config_frame, fit
from calibrate.fit import CalibratedModels
from calibrate.loader import load_benchmark


@pytest.fixture(scope="module")
def repeated(sample_csv: Path) -> pd.DataFrame:
    """The real sample three times over, shuffled: every configuration repeats, some cells are NaN."""
    sample = load_benchmark(sample_csv)
    table = pd.concat([sample] * 3, ignore_index=True)
    return table.sample(frac=1.0, random_state=0).reset_index(drop=True)


def test_distinct_rows_compares_only_the_prediction_inputs_and_missing_equals_missing() -> None:
    table = pd.DataFrame(
        {
            "model_name": ["a", "a", "a", "b", "a"],
            "number_gpus": [1.0, 1.0, 2.0, 1.0, 1.0],
            "time_limit_s": [np.nan, np.nan, np.nan, np.nan, 60.0],
            "line": [2, 3, 4, 5, 6],  # not read by a prediction
        }
    )
    first, inverse = config_frame.distinct_rows(table)
    assert first.tolist() == [0, 2, 3, 4]
    assert inverse.tolist() == [0, 0, 1, 2, 3]


def test_a_table_of_repeats_gets_the_numbers_of_row_by_row(
    models: CalibratedModels, repeated: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _ = config_frame.distinct_rows(repeated)
    assert len(repeated) >= fit.DISTINCT_FROM_ROWS and len(first) <= len(repeated) / 3
    once_each = models.predict_frame(repeated, power=True)
    monkeypatch.setattr(fit, "DISTINCT_FROM_ROWS", len(repeated) + 1)
    row_by_row = models.predict_frame(repeated, power=True)
    pd.testing.assert_frame_equal(once_each, row_by_row)


def test_a_bad_cell_is_named_by_its_row_in_the_whole_table(
    models: CalibratedModels, repeated: pd.DataFrame
) -> None:
    bad = repeated.copy()
    bad.loc[2500, "number_gpus"] = 0  # past the loader, as a frame built in code can be
    with pytest.raises(ValueError, match=r"^row 2500: column 'number_gpus'"):
        models.predict_frame(bad)
