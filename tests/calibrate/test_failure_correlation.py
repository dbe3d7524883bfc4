"""The failure model's shared error, measured from out-of-fold residuals grouped by error family."""

from __future__ import annotations

import numpy as np
import pytest

from calibrate.failure import failure_error_correlation


def test_failures_that_move_with_their_family_measure_a_large_share() -> None:
    rng = np.random.default_rng(0)
    families = np.repeat(np.arange(40), 25)
    # Each family is misjudged as a whole: the model says 0.5, a family really runs with 0.1 or 0.9.
    truth = np.where(rng.random(40) < 0.5, 0.1, 0.9)[families]
    ran = rng.random(len(families)) < truth
    share = failure_error_correlation(np.full(len(families), 0.5), ran, families)
    # z = (ran - 0.5) / 0.5 = +-1; within a family E[z z'] = (2 * 0.9 - 1)^2 = 0.64, E[z^2] = 1.
    assert share == pytest.approx(0.64, abs=0.08)


def test_independent_failures_measure_none() -> None:
    rng = np.random.default_rng(1)
    families = np.repeat(np.arange(40), 25)
    p = rng.uniform(0.2, 0.8, len(families))
    ran = rng.random(len(families)) < p  # the model is right: residuals are independent noise
    assert failure_error_correlation(p, ran, families) < 0.05


def test_too_few_families_measure_nothing() -> None:
    families = np.array([0, 0, 1, 1])
    assert failure_error_correlation(np.full(4, 0.5), np.array([1, 1, 0, 0], bool), families) == 0.0
