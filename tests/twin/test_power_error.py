"""The power model's error in the twin's ensembles: each job's power drawn log-normal with the prediction
as its mean, with a family shock of known share, spreads energy by its analytical value; throughput and
failure draws stay as they were, and a model without a power error keeps each job's power exact."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from tests.twin.conftest import one_node
from tests.twin.test_correlated import one_family_workload, two_family_workload
from twin.domain import JobConfig
from twin.ensemble import EnsembleSpec, run_ensemble
from twin.plan import build_plan, prepare_catalog
from twin.randomness import run_key
from twin.slo_attainment import SloSet

POWER_W = 300.0
SIGMA = 0.1  # log-power error of every configuration


class KnownPowerModels:
    """1000 tokens/s exactly (a band of no width: every job holds its GPU 1 h), never fails, 300 W."""

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full((len(configs), 3), 1000.0)

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.ones(len(configs))

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), POWER_W)


class PowerErrorModels(KnownPowerModels):
    def __init__(self, rho: float, sigma: float = SIGMA) -> None:
        self.rho, self.sigma = rho, sigma

    def predict_power_error(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.tile([self.sigma, self.rho], (len(configs), 1))


def energy_per_run(models: KnownPowerModels, n: int, runs: int) -> np.ndarray:
    workload = one_family_workload(n)
    catalog = prepare_catalog(workload.catalog, models)
    spec = EnsembleSpec(cluster=one_node(), workload=workload, catalog=catalog, slos=SloSet(slos=[]))
    return np.array([o.summary["energy_kwh"] for o in run_ensemble(spec, runs, workers=1)])


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_a_shared_power_shock_spreads_energy_by_its_analytical_value(rho: float) -> None:
    n, runs = 400, 300
    energy = energy_per_run(PowerErrorModels(rho), n, runs)
    # Job j draws P exp(sigma z_j), z_j = sqrt(rho) s + sqrt(1 - rho) e_j, for 1 GPU-hour: over n jobs the own
    # errors average out, so log(energy) moves by sigma sqrt(rho) s, plus the own errors' share.
    expected = SIGMA * np.sqrt(rho + (1 - rho) / n)
    assert np.std(np.log(energy), ddof=1) == pytest.approx(expected, rel=0.2)
    # The draw is log-normal with the prediction as its mean: P per GPU-hour.
    mean = n * POWER_W / 1000.0
    assert energy.mean() == pytest.approx(mean, abs=4 * expected * mean / np.sqrt(runs) + 1e-9)


def test_without_a_power_error_each_jobs_power_is_the_prediction() -> None:
    energy = energy_per_run(KnownPowerModels(), 50, 5)
    np.testing.assert_allclose(energy, 50 * POWER_W / 1000.0, rtol=1e-12)
    catalog = prepare_catalog(one_family_workload(4).catalog, KnownPowerModels())
    assert catalog.power_error_scale is None and catalog.power_correlation is None


def test_the_power_draw_leaves_every_other_draw_as_it_was() -> None:
    """Run times and failures of a run are the same with and without the power error: a what-if on power
    pairs with its baseline, and adding the power stream did not reshuffle the other streams."""

    class Known(KnownPowerModels):
        def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
            return np.tile([800.0, 1000.0, 1250.0], (len(configs), 1))

        def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
            return np.full(len(configs), 0.5)

    class Uncertain(Known):
        def predict_power_error(self, configs: Sequence[JobConfig]) -> np.ndarray:
            return np.tile([SIGMA, 0.5], (len(configs), 1))

    workload = one_family_workload(200)
    key = run_key(np.random.default_rng(3))
    with_error = build_plan(workload, prepare_catalog(workload.catalog, Uncertain()), one_node(), key)
    without = build_plan(workload, prepare_catalog(workload.catalog, Known()), one_node(), key)
    np.testing.assert_array_equal(with_error.hold_s, without.hold_s)
    np.testing.assert_array_equal(with_error.fails, without.fails)
    assert np.all(without.power_w == POWER_W)
    assert not np.allclose(with_error.power_w, POWER_W)


def test_families_draw_their_own_power_shocks() -> None:
    workload = two_family_workload(400)
    catalog = prepare_catalog(workload.catalog, PowerErrorModels(0.9))
    means = []
    for index in range(60):
        plan = build_plan(workload, catalog, one_node(), run_key(np.random.default_rng([5, index])))
        z = (np.log(plan.power_w[np.argsort(plan.row)] / POWER_W) + SIGMA**2 / 2) / SIGMA
        means.append([z[0::2].mean(), z[1::2].mean()])
        # Each job's own draw is a standard normal's across its family's jobs (here around the shock).
        assert np.std(z[0::2]) == pytest.approx(np.sqrt(1 - 0.9), rel=0.25)
    shocks = np.array(means)
    # A family's mean moves by its shock, sqrt(0.9) standard deviations, independently of the other's.
    assert np.std(shocks[:, 0]) == pytest.approx(np.sqrt(0.9), rel=0.3)
    assert abs(np.corrcoef(shocks.T)[0, 1]) < 0.35


def test_a_negative_or_missing_power_error_is_refused() -> None:
    class Broken(PowerErrorModels):
        def predict_power_error(self, configs: Sequence[JobConfig]) -> np.ndarray:
            return np.tile([-0.1, 0.5], (len(configs), 1))

    with pytest.raises(ValueError, match="power error"):
        prepare_catalog(one_family_workload(4).catalog, Broken(0.5))

    class Short(PowerErrorModels):
        def predict_power_error(self, configs: Sequence[JobConfig]) -> np.ndarray:
            return np.zeros((len(configs), 1))

    with pytest.raises(ValueError, match="power error of shape"):
        prepare_catalog(one_family_workload(4).catalog, Short(0.5))
