"""The share of error a family shares, measured from held-out residuals, recovers a known one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from calibrate.correlation import Z90, shared_share, standardize
from calibrate.fit import CalibratedModels
from calibrate.loader import load_benchmark


@pytest.mark.parametrize("rho", [0.0, 0.3, 0.7])
def test_a_known_shared_share_is_recovered(rho: float) -> None:
    rng = np.random.default_rng(1)
    families = np.repeat(np.arange(200), 12)
    z = np.sqrt(rho) * rng.standard_normal(200)[families] + np.sqrt(1 - rho) * rng.standard_normal(
        len(families)
    )
    assert shared_share(z, families) == pytest.approx(rho, abs=0.06)


def test_residuals_are_standardized_by_the_band_and_small_samples_say_nothing() -> None:
    z = standardize(np.array([-0.2, 0.1, 0.4]), np.full(3, -0.2), np.full(3, 0.1))
    assert z.tolist() == pytest.approx([-Z90, Z90, 3.0])  # clipped at 3
    assert shared_share(np.ones(4), np.array([0, 0, 1, 1])) is None  # two families are too few


def test_a_fitted_version_carries_its_error_correlation(models: CalibratedModels) -> None:
    """The session's calibrated version (tests/calibrate/conftest.py)."""
    shares = models.info["error_correlation"]
    # By novelty level, from seen (0) over a seen region's edge (2) to a new region (1): never decreasing.
    assert set(shares) == {"0", "1", "2"} and 0.0 <= shares["0"] <= shares["2"] <= shares["1"] < 1.0
    _, params = models.to_parts()
    assert params["throughput"]["error_correlation"] == shares
    # The error's distribution in band units: rising, and about ±1.28 at the band's own p10 and p90.
    seen = np.asarray(models.info["error_quantiles"]["0"])
    assert np.all(np.diff(seen) >= 0) and seen[0] < -1.28 < seen[-1]
    from twin.families import ERROR_QUANTILE_LEVELS

    p10, p90 = np.interp([0.1, 0.9], ERROR_QUANTILE_LEVELS, seen)
    assert p10 == pytest.approx(-Z90, abs=0.35) and p90 == pytest.approx(Z90, abs=0.35)


def test_a_fitted_version_carries_its_failure_correlation_through_the_registry_parts(
    models: CalibratedModels,
) -> None:
    """The session's calibrated version (tests/calibrate/conftest.py)."""
    from twin.domain import JobConfig

    share = models.info["failure_error_correlation"]
    assert 0.0 <= share < 1.0 and share == models.failure.error_correlation
    estimators, params = models.to_parts()
    assert params["failure"]["error_correlation"] == share
    again = CalibratedModels.from_parts(estimators, params)
    config = JobConfig("llama3.1-8b", "lora", "NVIDIA-A100-SXM4-80GB", 2, 1, 4, 1024)  # a pair it knows
    assert again.predict_failure_correlation([config, config]).tolist() == [share, share]
    del params["failure"]["error_correlation"]  # a version saved before it: independent failures
    assert CalibratedModels.from_parts(estimators, params).failure.error_correlation == 0.0


def test_a_novel_llm_and_method_share_more_failure_error_through_the_registry(  # type: ignore[no-untyped-def]
    calibrated_models_dir,
) -> None:
    """Measured on held-out blocks where the LLM and method were new to the member, a novel pair's family
    shares more of the failure model's error than a known one's; a config gets the share of its pair's
    novelty from the stored version (and the twin's plan draws with it), and a version saved before the
    novel share uses one share for all."""
    from calibrate.fit import CalibratedModels
    from calibrate.registry import ModelRegistry
    from twin.domain import JobConfig

    registry = ModelRegistry(calibrated_models_dir)
    models = registry.load(registry.in_use() or "")
    known = models.info["failure_error_correlation"]
    novel = models.info["failure_error_correlation_novel"]
    assert novel is not None and 0.0 <= known < novel < 1.0
    assert novel > known + 0.1  # a whole novel family is misjudged at once (0.45 against 0.03 on the sample)
    pairs = models.failure.known_pairs
    llm, method = next(p.split("|") for p in sorted(pairs) if p.endswith("|full"))
    other = "gptq-lora" if f"{llm}|gptq-lora" not in pairs else "lora"
    assert f"{llm}|{other}" not in pairs
    seen, new_pair, new_llm = (
        JobConfig(name, how, "NVIDIA-A100-SXM4-80GB", 2, 1, 4, 1024)
        for name, how in ((llm, method), (llm, other), ("an-llm-nobody-tuned-7b", method))
    )
    assert models.predict_failure_correlation([seen, new_pair, new_llm]).tolist() == [known, novel, novel]
    # What the twin's ensemble draws the families' failure shocks with (twin.plan).
    from twin.plan import prepare_catalog

    catalog = prepare_catalog([seen, new_pair, new_llm], models)
    assert catalog.failure_correlation is not None
    assert catalog.failure_correlation.tolist() == [known, novel, novel]
    estimators, params = models.to_parts()
    del params["failure"]["novel_error_correlation"]  # a version saved before it
    older = CalibratedModels.from_parts(estimators, params)
    assert older.predict_failure_correlation([seen, new_pair]).tolist() == [known, known]


def test_a_stored_version_gives_the_twin_its_failure_members(calibrated_models_dir) -> None:  # type: ignore[no-untyped-def]
    """The cross-fitted members' p_valid, whose mean is p_valid, reach the twin's catalog, which draws one
    member per run."""
    from calibrate.registry import ModelRegistry
    from twin.domain import JobConfig
    from twin.plan import prepare_catalog

    registry = ModelRegistry(calibrated_models_dir)
    models = registry.load(registry.in_use() or "")
    configs = [JobConfig("llama3-8b", "lora", "NVIDIA-A100-SXM4-80GB", g, 1, 8 * g, 4096) for g in (1, 2, 4)]
    members = models.predict_failure_members(configs)
    assert members.shape == (3, len(models.failure.members))
    np.testing.assert_allclose(members.mean(axis=1), models.predict_failure(configs), rtol=0, atol=1e-12)
    catalog = prepare_catalog(configs, models)
    assert catalog.p_valid_members is not None
    np.testing.assert_allclose(catalog.p_valid_members, members, rtol=0, atol=1e-12)
    # The catalog's p_valid, now the members' mean, is exactly what predict_failure gives.
    np.testing.assert_array_equal(catalog.p_valid, models.predict_failure(configs))
    assert models.predict_failure_members([]).shape == (0, len(models.failure.members))


def test_a_stored_version_gives_the_twin_its_power_error_by_novelty(calibrated_models_dir) -> None:  # type: ignore[no-untyped-def]
    """The power model's held-out error (spread of log watts, a family's share) by novelty level, read back
    from the registry: a configuration of a region the version never saw is less sure than a seen one, a GPU
    type without power telemetry shares its whole error, and the twin's catalog carries both. A version
    saved before them gives none (each job's power known)."""
    from calibrate.correlation import MAX_SHARE
    from calibrate.fit import CalibratedModels
    from calibrate.registry import ModelRegistry
    from twin.plan import prepare_catalog

    registry = ModelRegistry(calibrated_models_dir)
    models = registry.load(registry.in_use() or "")
    scale, share = models.info["power_error_scale"], models.info["power_error_correlation"]
    assert set(scale) == set(share) == {"0", "1", "2"}
    # From seen (0) over a seen region's edge (2) to a new region (1): never surer, never less shared.
    assert 0.0 < scale["0"] <= scale["2"] <= scale["1"] < 1.0
    assert 0.0 <= share["0"] <= share["2"] <= share["1"] < 1.0
    assert scale["1"] > 1.5 * scale["0"]  # ~0.18 against ~0.07 on the sample
    # Each of the sample's configurations gets its novelty level's figures (the seen ones, most of them).
    from calibrate.config_frame import configs_to_frame
    from calibrate.loader import bundled_benchmark_path
    from twin.backtest import _configs

    configs, _ = _configs(load_benchmark(bundled_benchmark_path()).query("outcome == 'valid'"))
    configs = [c for c in configs if c.gpu_model in models.power.gpus_with_power]
    levels = models.throughput.levels(models.matrix(configs_to_frame(configs))[0])
    error = models.predict_power_error(configs)
    expected = [[scale[str(k)], share[str(k)]] for k in levels]
    assert error.tolist() == expected and np.mean(levels == 0) > 0.9
    seen = configs[int(np.flatnonzero(levels == 0)[0])]
    new_region = replace(seen, model_name="an-llm-nobody-tuned-7b")
    unmeasured = replace(seen, gpu_model="NVIDIA-A100-80GB-PCIe")
    assert "NVIDIA-A100-80GB-PCIe" not in models.power.gpus_with_power
    error = models.predict_power_error([seen, new_region, unmeasured])
    assert error[:2].tolist() == [[scale["0"], share["0"]], [scale["1"], share["1"]]]
    assert error[2].tolist() == [models.power.unmeasured_error_scale, MAX_SHARE]
    catalog = prepare_catalog([seen, new_region, unmeasured], models)
    assert catalog.power_error_scale is not None and catalog.power_correlation is not None
    np.testing.assert_array_equal(catalog.power_error_scale, error[:, 0])
    np.testing.assert_array_equal(catalog.power_correlation, np.minimum(error[:, 1], 0.99))
    estimators, params = models.to_parts()
    for key in ("error_scale", "error_correlation", "unmeasured_error_scale"):
        del params["power"][key]  # a version saved before them
    older = CalibratedModels.from_parts(estimators, params)
    assert not older.predict_power_error([seen, new_region, unmeasured])[:2].any()


def test_error_ranges_nest_by_novelty_and_a_thin_level_borrows_all() -> None:
    from calibrate.performance import EDGE_REGION, NEW_REGION, SEEN_REGION, _error_range

    rng = np.random.default_rng(0)
    seen = rng.normal(0, 0.1, 200)
    edge = rng.normal(0, 0.3, 100)
    residuals = np.concatenate([seen, edge, [-2.0, 1.0]])  # two rows of a new region: too few alone
    levels = np.array([SEEN_REGION] * 200 + [EDGE_REGION] * 100 + [NEW_REGION] * 2)
    ranges = _error_range(residuals, levels)
    assert ranges[str(SEEN_REGION)] == pytest.approx([seen.min(), seen.max()], abs=1e-4)
    # The edge holds the seen range (a more novel configuration is never held to a narrower one).
    assert ranges[str(EDGE_REGION)] == pytest.approx(
        [min(seen.min(), edge.min()), max(seen.max(), edge.max())], abs=1e-4
    )
    assert ranges[str(NEW_REGION)] == pytest.approx([-2.0, max(1.0, edge.max(), seen.max())], abs=1e-4)
    assert _error_range(np.zeros(0), np.zeros(0, dtype=int)) == {}


def test_a_stored_version_bounds_the_twins_throughput_draws(calibrated_models_dir) -> None:  # type: ignore[no-untyped-def]
    """The held-out error range by novelty level goes with the version and reaches the twin's catalog; an
    older version without it leaves the draws unbounded."""
    from calibrate.fit import CalibratedModels
    from calibrate.registry import ModelRegistry
    from twin.domain import JobConfig
    from twin.plan import prepare_catalog

    registry = ModelRegistry(calibrated_models_dir)
    models = registry.load(registry.in_use() or "")
    ranges = models.info["error_range"]
    assert set(ranges) == {"0", "1", "2"}
    for less, more in (("0", "2"), ("2", "1")):
        assert ranges[more][0] <= ranges[less][0] < 0.0 < ranges[less][1] <= ranges[more][1]
    # On the sample the slowest held-out run was a few times slower than predicted, not thousands.
    assert 1.5 < np.exp(-ranges["1"][0]) < 20.0
    seen = JobConfig("llama3-8b", "lora", "NVIDIA-A100-SXM4-80GB", 2, 1, 4, 1024)
    new_region = JobConfig("an-llm-nobody-tuned-7b", "lora", "NVIDIA-A100-SXM4-80GB", 2, 1, 4, 1024)
    predicted = models.predict_error_range([seen, new_region])
    assert predicted[1].tolist() == ranges["1"]
    catalog = prepare_catalog([seen, new_region], models)
    assert catalog.error_range is not None
    np.testing.assert_array_equal(catalog.error_range, predicted)
    estimators, params = models.to_parts()
    del params["throughput"]["error_range"]  # a version saved before it
    older = CalibratedModels.from_parts(estimators, params).predict_error_range([seen])
    assert older.tolist() == [[-np.inf, np.inf]]


def test_a_catalog_builds_each_matrix_once_and_predicts_as_before(calibrated_models_dir) -> None:  # type: ignore[no-untyped-def]
    """The twin asks eight questions of one catalog: the feature matrix is built once for the runnable
    configurations and once for all of them (not once per question), read-only, and every answer is what
    a fresh version gives for the same configurations asked alone."""
    from calibrate.loader import bundled_benchmark_path
    from calibrate.registry import ModelRegistry
    from twin.backtest import _configs
    from twin.plan import prepare_catalog

    registry = ModelRegistry(calibrated_models_dir)
    models = registry.load(registry.in_use() or "")
    configs, _ = _configs(load_benchmark(bundled_benchmark_path()).head(600))
    built: list[int] = []
    matrix = models.matrix
    models.matrix = lambda table: built.append(len(table)) or matrix(table)  # type: ignore[method-assign]
    catalog = prepare_catalog(configs, models)
    runnable = int((catalog.reject == 0).sum())
    assert 0 < runnable < len(configs) and sorted(built) == sorted([runnable, len(configs)])
    # A new list of the same configuration objects is the same question; an equal copy is built anew.
    assert models._features(list(configs)).X.flags.writeable is False
    assert len(built) == 2
    models.predict_error_range([replace(c) for c in configs])
    assert len(built) == 3
    # Every answer is the one the matrix built for that question alone gives.
    from calibrate.config_frame import configs_to_frame

    runs = [c for c, r in zip(configs, catalog.reject, strict=True) if r == 0]
    X_runs, gpus_runs, _ = matrix(configs_to_frame(runs))
    X_all, _, _ = matrix(configs_to_frame(configs))
    np.testing.assert_array_equal(catalog.throughput[catalog.reject == 0], models.throughput.predict(X_runs))
    np.testing.assert_array_equal(
        catalog.power_w[catalog.reject == 0], models.power.predict(X_runs, gpus_runs)
    )
    levels_runs, levels_all = models.throughput.levels(X_runs), models.throughput.levels(X_all)
    assert catalog.power_error_scale is not None
    np.testing.assert_array_equal(
        catalog.power_error_scale[catalog.reject == 0],
        models.power.predict_error(levels_runs, gpus_runs)[:, 0],
    )
    np.testing.assert_array_equal(catalog.error_range, models.throughput.error_range_at(levels_all))
    np.testing.assert_array_equal(
        catalog.error_correlation, models.throughput.error_correlation_at(levels_all)
    )
    mixed = [configs[3], configs[0], *configs[5:9]]
    X_mixed, _, _ = matrix(configs_to_frame(mixed))
    np.testing.assert_array_equal(models.predict_throughput(mixed), models.throughput.predict(X_mixed))
