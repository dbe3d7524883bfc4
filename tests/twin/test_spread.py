"""The ensemble's spread per interval, taken for every interval at once, equals the spread of each interval
taken alone (`twin.ensemble.spread`, the reference kept here), float for float, whatever runs lack; so do
the quantiles of a run's waits per interval, taken for every interval at once."""

from __future__ import annotations

import numpy as np
import pytest

from twin.ensemble import spread, spread_series
from twin.run_metrics import chunk_quantiles


def spread_of_each_interval(rows: list[np.ndarray]) -> dict[str, list[float | None]]:
    """The reading before: one `spread` per interval."""
    width = max(len(r) for r in rows)
    stack = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        stack[i, : len(r)] = r
    out: dict[str, list[float | None]] = {"mean": [], "p10": [], "p90": []}
    for column in stack.T:
        s = spread(column)
        for k in out:
            out[k].append(s[k])
    return out


@pytest.mark.parametrize("runs", [1, 2, 5, 8, 9, 16, 32, 33])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_spread_of_every_interval_at_once_equals_each_intervals_own(runs: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    width = 300
    # Runs that end early (no horizon), values missing in the middle (no data), heavy tails, ties, zeros.
    rows = []
    for _ in range(runs):
        row = rng.lognormal(0.0, 2.0, width) * rng.choice([1.0, 1e6, 1e-6])
        row[rng.random(width) < 0.05] = np.nan
        row[rng.random(width) < 0.05] = 0.0
        row[rng.random(width) < 0.05] = 3.0
        row[0] = np.nan  # an interval no run has a value for
        rows.append(row[: rng.integers(2, width + 1)])
    if runs > 1:
        rows[1][:] = np.nan  # a run without a value anywhere
    got = spread_series(rows)
    want = spread_of_each_interval(rows)
    assert got == want  # exactly: None where no run has a value, the same floats elsewhere
    assert None in got["mean"] and any(v is not None for v in got["mean"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_quantiles_of_every_chunk_at_once_equal_each_chunks_own(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes = rng.choice([0, 0, 1, 2, 3, 7, 20, 101], size=500)  # empty intervals, one wait, many
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    values = rng.lognormal(5.0, 2.0, int(bounds[-1]))
    values[rng.random(len(values)) < 0.1] = 0.0  # jobs that never waited: ties
    got = chunk_quantiles(values, bounds, (0.5, 0.95))
    for b in range(len(sizes)):
        chunk = values[bounds[b] : bounds[b + 1]]
        if len(chunk):
            assert got[:, b].tolist() == np.quantile(chunk, [0.5, 0.95]).tolist()
        else:
            assert np.isnan(got[:, b]).all()
