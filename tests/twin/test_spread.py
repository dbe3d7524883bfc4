"""The ensemble's p10-p90: the interval that holds one more run, as the truth is one more draw to it."""

from __future__ import annotations

import numpy as np
import pytest

from twin.ensemble import spread


@pytest.mark.parametrize("runs", [16, 32])
def test_the_band_of_n_runs_holds_another_run_80_percent_of_the_time(runs: int) -> None:
    rng = np.random.default_rng(7)
    trials = 4000
    draws = rng.lognormal(0.0, 0.5, size=(trials, runs + 1))  # skewed, as GPU-hours and waits are
    held = 0
    for row in draws:
        band = spread(row[:runs])
        held += band["p10"] <= row[runs] <= band["p90"]
    # The runs' own interpolated percentiles hold it 71 % (16 runs) and 75 % (32 runs) of the time.
    assert 0.775 <= held / trials <= 0.83


def test_the_band_is_order_statistics_at_p_n_plus_1() -> None:
    values = np.arange(1.0, 17.0)  # 16 runs: p10 at 1.7, p90 at 15.3 (1-based)
    band = spread(values[::-1])
    assert band["p10"] == pytest.approx(1.7)
    assert band["p90"] == pytest.approx(15.3)
    assert band["mean"] == pytest.approx(8.5)
    few = spread([3.0, 1.0, 2.0])  # fewer than 9 runs: their range
    assert (few["p10"], few["p90"]) == (1.0, 3.0)
    assert spread([np.nan, np.nan]) == {"mean": None, "p10": None, "p90": None}
