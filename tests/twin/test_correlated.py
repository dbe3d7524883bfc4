"""Correlated model errors: with a common shock of known size shared by the jobs of one error family, the
ensemble's spread of GPU-hours matches its analytical value; without it, errors average out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from tests.twin.conftest import A100, one_node
from twin.domain import JobConfig
from twin.ensemble import EnsembleSpec, run_ensemble
from twin.plan import _Z90, PreparedCatalog, prepare_catalog
from twin.slo_attainment import SloSet
from twin.workload import Workload

# The band: p10 and p90 at a factor 1.25 either side of p50 (a symmetric log-normal band).
WIDTH = 1.25
SIGMA = np.log(WIDTH) / _Z90


class SharedErrorModels:
    """1000 tokens/s per job, band x/÷1.25, never fails; `rho` of the error shared within a family."""

    def __init__(self, rho: float | None) -> None:
        self.rho = rho

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.tile([1000.0 / WIDTH, 1000.0, 1000.0 * WIDTH], (len(configs), 1))

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.ones(len(configs))

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), 300.0)


class CorrelatedModels(SharedErrorModels):
    def predict_error_correlation(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), self.rho)


def one_family_workload(n: int) -> Workload:
    """n one-GPU jobs of one configuration family (batch sizes differ), 3.6e6 tokens each (1 h at p50)."""
    catalog = [JobConfig("llama3-70b", "lora", A100, 1, 1, b, 1024) for b in (1, 2, 4, 8)]
    return Workload(
        job_ids=[f"j{i}" for i in range(n)],
        arrival_s=np.zeros(n),
        gpus=np.ones(n, dtype=np.int64),
        gpu_models=[A100] * n,
        duration_s=np.full(n, np.nan),
        work_tokens=np.full(n, 3.6e6),
        config_idx=np.arange(n) % len(catalog),
        catalog=catalog,
    )


def gpu_hours_spread(catalog: PreparedCatalog, workload: Workload, runs: int) -> np.ndarray:
    spec = EnsembleSpec(cluster=one_node(), workload=workload, catalog=catalog, slos=SloSet(slos=[]))
    return np.array([o.summary["gpu_hours"] for o in run_ensemble(spec, runs, workers=1)])


@pytest.mark.parametrize("rho", [0.25, 0.6])
def test_a_common_shock_spreads_gpu_hours_by_its_analytical_value(rho: float) -> None:
    n, runs = 400, 300
    workload = one_family_workload(n)
    catalog = prepare_catalog(workload.catalog, CorrelatedModels(rho))
    assert catalog.error_correlation is not None and np.allclose(catalog.error_correlation, rho)
    hours = gpu_hours_spread(catalog, workload, runs)
    # A job's run time is 1 h * exp(-sigma z), z = sqrt(rho) s + sqrt(1 - rho) e: over many jobs the own
    # errors e average out, so log(GPU-hours) = const - sigma sqrt(rho) s, s ~ N(0, 1) shared by the run.
    # Its standard deviation across runs is sigma*sqrt(rho) (plus the own errors' share, sigma^2(1-rho)/n).
    expected = np.sqrt(SIGMA**2 * rho + SIGMA**2 * (1 - rho) / n)
    assert np.std(np.log(hours), ddof=1) == pytest.approx(expected, rel=0.15)
    # And the mean over runs stays where independent draws put it: E[exp(-sigma z)] = exp(sigma^2 / 2).
    assert hours.mean() == pytest.approx(n * np.exp(SIGMA**2 / 2), rel=0.05)


def test_independent_errors_average_out_over_many_jobs() -> None:
    n, runs = 400, 100
    workload = one_family_workload(n)
    independent = prepare_catalog(workload.catalog, SharedErrorModels(None))  # no correlation method
    assert independent.error_correlation is not None and not independent.error_correlation.any()
    spread = np.std(np.log(gpu_hours_spread(independent, workload, runs)), ddof=1)
    # The own errors' share only: sigma * sqrt(e^{sigma^2} - 1)-ish / sqrt(n), about sigma / sqrt(n).
    assert spread == pytest.approx(SIGMA / np.sqrt(n), rel=0.25)
    shared = np.std(np.log(gpu_hours_spread(independent.with_correlation(0.5), workload, runs)), ddof=1)
    assert shared > 10 * spread


def two_family_workload(n: int) -> Workload:
    """n one-GPU jobs alternating between two error families (even jobs the first), 3.6e6 tokens each."""
    catalog = [
        JobConfig("llama3-70b", "lora", A100, 1, 1, 4, 1024),
        JobConfig("mistral-7b", "full", A100, 1, 1, 4, 1024),
    ]
    return Workload(
        job_ids=[f"j{i}" for i in range(n)], arrival_s=np.zeros(n), gpus=np.ones(n, dtype=np.int64),
        gpu_models=[A100] * n, duration_s=np.full(n, np.nan), work_tokens=np.full(n, 3.6e6),
        config_idx=np.arange(n) % 2, catalog=catalog,
    )  # fmt: skip


def test_families_draw_their_own_shocks_and_runs_pair_across_scenarios() -> None:
    from twin.plan import build_plan
    from twin.randomness import run_key

    workload = two_family_workload(600)
    catalog = prepare_catalog(workload.catalog, CorrelatedModels(0.9))
    means = []
    for index in range(40):
        key = run_key(np.random.default_rng([0, index]))
        plan = build_plan(workload, catalog, one_node(), key)
        hold = plan.hold_s[np.argsort(plan.row)]
        means.append([np.log(hold[0::2]).mean(), np.log(hold[1::2]).mean()])
        again = build_plan(workload, catalog, one_node(), key)
        assert np.array_equal(plan.hold_s, again.hold_s)  # the same run key, the same draws
    means_array = np.array(means)
    # Each family moves with its own shock: strongly spread across runs, barely correlated with the other.
    assert np.std(means_array[:, 0]) > 0.5 * SIGMA
    assert abs(np.corrcoef(means_array.T)[0, 1]) < 0.5


class HeavyTailedModels(SharedErrorModels):
    """Errors that are normal but for a slow tail: 5 % of jobs run at z = -8 band units (2.6x slower)."""

    def predict_error_quantiles(self, configs: Sequence[JobConfig]) -> np.ndarray:
        from scipy.special import ndtri

        from twin.families import ERROR_QUANTILE_LEVELS

        table = np.where(ERROR_QUANTILE_LEVELS <= 0.05, -8.0, ndtri(ERROR_QUANTILE_LEVELS))
        return np.tile(table, (len(configs), 1))


def test_jobs_draw_their_errors_from_the_models_error_distribution() -> None:
    from twin.plan import build_plan
    from twin.randomness import run_key

    n = 4000
    workload = one_family_workload(n)
    catalog = prepare_catalog(workload.catalog, HeavyTailedModels(None))
    plan = build_plan(workload, catalog, one_node(), run_key(np.random.default_rng(7)))
    slowdown = plan.hold_s / 3600.0  # 1 h at p50
    z = -np.log(slowdown) / SIGMA
    # The table's tail: about 5 % of the jobs 8 band units slow (interpolation spreads a little around it).
    assert np.mean(z < -7.0) == pytest.approx(0.045, abs=0.01)
    assert np.mean(z < -9.0) == 0.0  # nothing beyond the table's last level
    # In the body, the band still holds: about 80 % between p10 and p90.
    assert np.mean(np.abs(z) <= _Z90 + 1e-9) == pytest.approx(0.8, abs=0.03)
    # Without the table the same draws stay within 3 band units (a normal, clipped).
    normal = prepare_catalog(workload.catalog, SharedErrorModels(None))
    plain = build_plan(workload, normal, one_node(), run_key(np.random.default_rng(7)))
    assert np.max(np.abs(np.log(plain.hold_s / 3600.0))) <= 3 * SIGMA + 1e-9


class SharedFailureModels(SharedErrorModels):
    """Every job fails with probability `p`; `rho` of the failure model's error shared within a family."""

    def __init__(self, rho: float | None, p_fail: float) -> None:
        super().__init__(None)
        self.failure_rho, self.p_fail = rho, p_fail

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), 1.0 - self.p_fail)


class CorrelatedFailureModels(SharedFailureModels):
    def predict_failure_correlation(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.full(len(configs), self.failure_rho)


def failures_per_run(catalog: PreparedCatalog, workload: Workload, runs: int) -> np.ndarray:
    from twin.plan import build_plan
    from twin.randomness import run_key

    return np.array(
        [
            build_plan(workload, catalog, one_node(), run_key(np.random.default_rng([1, index]))).fails.sum()
            for index in range(runs)
        ]
    )


@pytest.mark.parametrize("rho", [0.0, 0.3])
def test_a_shared_failure_shock_spreads_the_failures_by_its_analytical_value(rho: float) -> None:
    n, runs, p = 200, 400, 0.5
    workload = one_family_workload(n)
    catalog = prepare_catalog(workload.catalog, CorrelatedFailureModels(rho, p))
    assert catalog.failure_correlation is not None and np.allclose(catalog.failure_correlation, rho)
    fails = failures_per_run(catalog, workload, runs)
    # Job i fails when Phi(sqrt(rho) s + sqrt(1 - rho) e_i) < p: a Gaussian copula. At p = 1/2 two jobs
    # of the family both fail with probability 1/4 + arcsin(rho) / (2 pi), so the count's variance is
    # n p (1 - p) + n (n - 1) arcsin(rho) / (2 pi); its mean stays n p (each job's marginal is unchanged).
    variance = n * p * (1 - p) + n * (n - 1) * np.arcsin(rho) / (2 * np.pi)
    assert np.var(fails, ddof=1) == pytest.approx(variance, rel=0.2)
    assert fails.mean() == pytest.approx(n * p, abs=4 * np.sqrt(variance / runs))


def test_models_without_a_failure_correlation_fail_independently() -> None:
    workload = one_family_workload(200)
    catalog = prepare_catalog(workload.catalog, SharedFailureModels(None, 0.5))
    assert catalog.failure_correlation is None
    spread = np.var(failures_per_run(catalog, workload, 300), ddof=1)
    assert spread == pytest.approx(200 * 0.25, rel=0.25)
    shared = np.var(failures_per_run(catalog.with_failure_correlation(0.5), workload, 300), ddof=1)
    assert shared > 10 * spread


class EnsembleFailureModels(SharedFailureModels):
    """A failure model of four members that disagree (p_valid 0.2, 0.4, 0.6, 0.8; their mean is 0.5)."""

    MEMBERS = (0.2, 0.4, 0.6, 0.8)

    def predict_failure_members(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.tile(self.MEMBERS, (len(configs), 1))


def test_each_run_takes_one_failure_member_for_all_its_jobs() -> None:
    n, runs = 200, 400
    workload = one_family_workload(n)
    catalog = prepare_catalog(workload.catalog, EnsembleFailureModels(None, 0.5))
    assert catalog.p_valid_members is not None
    np.testing.assert_allclose(catalog.p_valid_members.mean(axis=1), catalog.p_valid)
    fails = failures_per_run(catalog, workload, runs)
    # A run's jobs fail with one member's 1 - p: the count is binomial around one of n * (0.8, 0.6, 0.4,
    # 0.2). Its variance across runs is the binomial's, n q (1 - q) on average, plus n^2 Var(q).
    q = 1.0 - np.array(EnsembleFailureModels.MEMBERS)
    variance = n * np.mean(q * (1 - q)) + n**2 * np.var(q)
    assert np.var(fails, ddof=1) == pytest.approx(variance, rel=0.15)
    assert fails.mean() == pytest.approx(n * 0.5, abs=4 * np.sqrt(variance / runs))
    nearest = np.min(np.abs(fails[:, None] - n * q[None, :]), axis=1)
    assert np.all(nearest <= 4 * np.sqrt(n * 0.25))  # never between two members: one member per run
    # Every member is drawn, about equally often.
    counts = np.bincount(np.argmin(np.abs(fails[:, None] - n * q[None, :]), axis=1), minlength=len(q))
    assert counts.min() >= 0.15 * runs
    # Without members, the same model's p = 0.5 spreads the count by the binomial alone.
    plain = prepare_catalog(workload.catalog, SharedFailureModels(None, 0.5))
    alone = failures_per_run(plain, workload, runs)
    assert np.var(alone, ddof=1) == pytest.approx(n * 0.25, rel=0.2)


def test_a_model_with_members_is_asked_for_them_once_and_p_valid_is_their_mean() -> None:
    """The members give p_valid too (their mean): the failure model runs once per catalog, not twice."""

    class Counting(EnsembleFailureModels):
        asked_p_valid = 0

        def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
            Counting.asked_p_valid += 1
            return super().predict_failure(configs)

    catalog = prepare_catalog(one_family_workload(8).catalog, Counting(None, 0.5))
    assert Counting.asked_p_valid == 0
    assert catalog.p_valid_members is not None
    np.testing.assert_array_equal(catalog.p_valid_members, np.tile(EnsembleFailureModels.MEMBERS, (4, 1)))
    np.testing.assert_allclose(catalog.p_valid, 0.5)


class BoundedModels(HeavyTailedModels):
    """The heavy-tailed errors above, and held-out errors that never went beyond 2x slower or 1.5x faster."""

    RANGE = (-np.log(2.0), np.log(1.5))

    def predict_error_range(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.tile(self.RANGE, (len(configs), 1))


def test_no_job_is_drawn_further_from_its_prediction_than_held_out_errors_went() -> None:
    from twin.plan import build_plan
    from twin.randomness import run_key

    workload = one_family_workload(4000)
    key = run_key(np.random.default_rng(7))
    bounded = build_plan(workload, prepare_catalog(workload.catalog, BoundedModels(None)), one_node(), key)
    free = build_plan(workload, prepare_catalog(workload.catalog, HeavyTailedModels(None)), one_node(), key)
    low, high = BoundedModels.RANGE
    # Run time is 1 h at p50: within [1 h / 1.5, 2 h] with the range, ~2.6 h in the tail without it.
    assert bounded.hold_s.max() == pytest.approx(3600.0 * np.exp(-low))
    assert bounded.hold_s.min() == pytest.approx(3600.0 * np.exp(-high))
    assert free.hold_s.max() > 2.5 * 3600.0 and free.hold_s.min() < 3600.0 / 1.5
    # Inside the range every job keeps the draw it had: the range only cuts the tails.
    inside = (free.hold_s <= 3600.0 * np.exp(-low)) & (free.hold_s >= 3600.0 * np.exp(-high))
    assert inside.mean() > 0.9
    np.testing.assert_array_equal(bounded.hold_s[inside], free.hold_s[inside])
    np.testing.assert_array_equal(np.clip(free.hold_s, 1800.0 * 4 / 3, 7200.0), bounded.hold_s)


def test_an_error_range_that_excludes_the_prediction_is_refused() -> None:
    class Broken(BoundedModels):
        RANGE = (0.1, 0.5)  # every run faster than predicted: not a range of errors around it

    with pytest.raises(ValueError, match="error range"):
        prepare_catalog(one_family_workload(4).catalog, Broken(None))


def test_a_model_or_method_in_capitals_is_the_model_or_method() -> None:
    """As the models read them (trimmed, lower-cased): one error family, one size, no 'never measured'."""
    from twin.domain import model_params_b, unseen_model_warning
    from twin.families import error_family

    assert error_family(" Llama3-8B", "LoRA", "A100-SXM") == error_family("llama3-8b", "lora", "A100-SXM")
    assert model_params_b("Granite-4.0-H-Small") == model_params_b("granite-4.0-h-small") == 32
    assert unseen_model_warning("Llama3-8B ") is None
    assert "did you mean 'llama3-8b'" in (unseen_model_warning("Lama3-8B") or "")
    assert "from the size in its name" in (unseen_model_warning("acme-13b") or "")
    assert "from a typical size (its name says none)" in (unseen_model_warning("my-model") or "")


@pytest.mark.parametrize(
    ("written", "measured"),
    [
        ("meta-llama/Meta-Llama-3-8B", "llama3-8b"),
        ("meta-llama/Llama-3.1-8B", "llama3.1-8b"),
        ("Llama-2-70b-hf", "llama2-70b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct-v0.1"),
        ("ibm-granite/granite-4.0-h-small", "granite-4.0-h-small"),
        ("Llama_3.2_1B", "llama3.2-1b"),
    ],
)
def test_a_measured_model_named_as_hugging_face_names_it_is_that_model(written: str, measured: str) -> None:
    """Read as written, each was a model never measured: extrapolated, and advised on the failure model's
    bound for new models."""
    from twin.domain import model_params_b, name_key, unseen_model_warning
    from twin.families import error_family

    assert name_key(written) == measured
    assert unseen_model_warning(written) is None
    assert model_params_b(written) == model_params_b(measured)
    assert error_family(written, "lora", "L40S") == error_family(measured, "lora", "L40S")


def test_a_different_model_is_not_taken_for_a_measured_one() -> None:
    """An instruct tune, a base model of another generation, a method: their own names."""
    from twin.domain import name_key, unseen_model_warning

    for name in ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-2-7b-hf", "acme/llama3-8b-chat"):
        assert name_key(name) == name.strip().lower()
        assert unseen_model_warning(name) is not None
    assert [name_key(m) for m in ("LoRA", "full", "gptq-lora")] == ["lora", "full", "gptq-lora"]
