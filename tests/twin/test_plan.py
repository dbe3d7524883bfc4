"""From workload to plan: draws in the band, failures at 1 - p_valid, per-job streams, scenario changes."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from calibrate.loader import bundled_benchmark_path, load_benchmark
from calibrate.registry import ModelRegistry
from tests.twin.conftest import A100, RuleModels, config_workload, mixed_cluster
from twin.config_changes import Admission, Optimization, optimize_config, repair_config
from twin.domain import JobConfig
from twin.job_config import config_from_row
from twin.plan import JobPlan, PlanOptions, PreparedCatalog, band_draw, build_plan, prepare_catalog
from twin.randomness import job_keys, job_uniforms
from twin.workload import RunningState, Workload


def one_config_workload(n: int, config: JobConfig, work: float = 1e7) -> Workload:
    return Workload(
        job_ids=[f"j{i}" for i in range(n)],
        arrival_s=np.zeros(n),
        gpus=np.full(n, config.number_gpus),
        gpu_models=[config.gpu_model] * n,
        duration_s=np.full(n, np.nan),
        work_tokens=np.full(n, work),
        config_idx=np.zeros(n, dtype=np.int64),
        catalog=[config],
    )


def test_band_draw_honours_p10_p50_p90() -> None:
    u = (np.arange(100_000) + 0.5) / 100_000
    band = np.tile([[800.0, 1000.0, 1500.0]], (len(u), 1))
    draws = band_draw(band, u)
    assert np.quantile(draws, [0.1, 0.5, 0.9]) == pytest.approx([800.0, 1000.0, 1500.0], rel=1e-3)


def test_run_time_is_work_over_drawn_throughput_and_failures_follow_p_valid() -> None:
    config = JobConfig("llama3-8b", "lora", A100, 2, 1, 128, 1024)  # batch 128 > 64: p_valid 0.3
    models = RuleModels(per_gpu=500.0, p_fail_valid=0.3)
    workload = one_config_workload(20_000, config)
    plan = build_plan(workload, prepare_catalog(workload.catalog, models), mixed_cluster(), 99)
    assert plan.fails.mean() == pytest.approx(0.7, abs=0.02)
    runs = plan.hold_s[~plan.fails]
    # 1e7 tokens at p10/p50/p90 of 800/1000/1250 tokens/s.
    assert np.quantile(runs, [0.1, 0.5, 0.9]) == pytest.approx([8000.0, 10000.0, 12500.0], rel=0.02)
    assert np.allclose(plan.estimate_s, 10_000.0)
    # Failures strike 1-10 min in by default (no observed failure times).
    assert plan.hold_s[plan.fails].min() >= 60.0 and plan.hold_s[plan.fails].max() <= 600.0


def test_a_jobs_draws_do_not_depend_on_the_other_jobs(models: RuleModels) -> None:
    workload = config_workload(np.random.default_rng(1), 500, 10_000.0)
    keep = np.arange(len(workload)) % 3 != 0
    fewer = Workload(
        job_ids=[j for j, k in zip(workload.job_ids, keep, strict=True) if k],
        arrival_s=workload.arrival_s[keep],
        gpus=workload.gpus[keep],
        gpu_models=[g for g, k in zip(workload.gpu_models, keep, strict=True) if k],
        duration_s=workload.duration_s[keep],
        work_tokens=workload.work_tokens[keep],
        config_idx=workload.config_idx[keep],
        catalog=workload.catalog,
    )
    catalog = prepare_catalog(workload.catalog, models)
    full = build_plan(workload, catalog, mixed_cluster(), 5)
    part = build_plan(fewer, catalog, mixed_cluster(), 5)
    hold = dict(zip(full.job_ids, full.hold_s, strict=True))
    fails = dict(zip(full.job_ids, full.fails, strict=True))
    assert all(hold[j] == h for j, h in zip(part.job_ids, part.hold_s, strict=True))
    assert all(fails[j] == f for j, f in zip(part.job_ids, part.fails, strict=True))


def test_job_uniforms_are_uniform_and_keyed() -> None:
    keys = job_keys([f"job-{i}" for i in range(50_000)])
    u = job_uniforms(7, keys, 3)
    assert ((u > 0) & (u < 1)).all()
    assert u.mean(axis=0) == pytest.approx([0.5, 0.5, 0.5], abs=0.01)
    assert abs(np.corrcoef(u.T)[0, 1]) < 0.02
    assert not np.array_equal(u, job_uniforms(8, keys, 3))
    np.testing.assert_array_equal(u[10:20], job_uniforms(7, keys[10:20], 3))


def test_running_job_finishes_its_rest_at_its_observed_rate() -> None:
    config = JobConfig("llama3-8b", "lora", A100, 1, 1, 8, 1024)
    workload = one_config_workload(1, config, work=1e6)
    workload.running = {0: RunningState(elapsed_s=300.0, tokens_done=6e5, tokens_per_second=2000.0)}
    plan = build_plan(workload, prepare_catalog(workload.catalog, RuleModels()), mixed_cluster(), 1)
    assert plan.hold_s[0] == pytest.approx(200.0)  # 4e5 tokens left at 2000 tokens/s
    assert plan.elapsed_s[0] == 300.0


CAPPED_PROTOCOL = {"experiment_id": "SFTTrainer.x-stop_after_seconds.600.0-optim.adamw"}


@pytest.mark.parametrize(
    ("time_limit_s", "extra", "cap"),
    [
        (600.0, {}, 600.0),
        # The trainer of a protocol that stops after N seconds stops itself there, time limit or not (a live
        # job whose telemetry names its protocol but no limit, a jobs file's row with an empty limit).
        (None, CAPPED_PROTOCOL, 600.0),
        (300.0, CAPPED_PROTOCOL, 300.0),
    ],
)
def test_time_limit_caps_the_run(time_limit_s: float | None, extra: dict[str, str], cap: float) -> None:
    config = JobConfig("llama3-8b", "lora", A100, 1, 1, 8, 1024, time_limit_s=time_limit_s, extra=extra)
    plan = build_plan(
        one_config_workload(50, config, work=1e8), prepare_catalog([config], RuleModels()), mixed_cluster(), 1
    )
    assert (plan.hold_s == cap).all() and (plan.estimate_s == cap).all()


def test_repair_and_optimizations_and_right_sizing() -> None:
    broken = JobConfig("mixtral-8x7b-instruct-v0.1", "lora", A100, 4, 1, 10, 1024, fast_moe=8)
    repaired = repair_config(broken)
    assert repaired.batch_size == 12 and repaired.fast_moe == 4
    multi = JobConfig("mixtral-8x7b-instruct-v0.1", "full", A100, 16, 2, 64, 1024)
    on = optimize_config(multi, frozenset(Optimization))
    assert on.fast_kernels and on.enable_roce and on.fast_moe == 8
    single = JobConfig("llama3-8b", "full", A100, 1, 1, 8, 1024)
    assert not optimize_config(single, frozenset({Optimization.ROCE})).enable_roce
    # Right-sizing: batch 256 on 2 GPUs fails under RuleModels (> 64); the largest halving that runs is 64.
    big = JobConfig("llama3-8b", "lora", A100, 2, 1, 256, 1024)
    prepared = prepare_catalog([big], RuleModels(), PlanOptions(right_size_batches=True))
    assert prepared.configs[0].batch_size == 64 and prepared.p_valid[0] == 1.0 and prepared.changed[0]
    fast = prepare_catalog([single], RuleModels(), PlanOptions(optimizations=frozenset({"fast_kernels"})))
    assert fast.throughput[0, 1] == 1.5 * prepare_catalog([single], RuleModels()).throughput[0, 1]


def test_models_are_asked_once_per_distinct_configuration() -> None:
    models = RuleModels()
    config = JobConfig("llama3-8b", "lora", A100, 1, 1, 8, 1024)
    workload = one_config_workload(10_000, config)
    prepare_catalog(workload.catalog, models)
    assert models.calls == 1


def test_a_running_job_fails_with_the_chance_left_after_surviving_so_far() -> None:
    # p_valid 0.5 and failures uniform over 1-10 min; at 330 s half the failures are behind us, so
    # P(fail | still running) = 0.5 * 0.5 / (0.5 + 0.5 * 0.5) = 1/3, within the 270 s that remain.
    config = JobConfig("llama3-8b", "lora", A100, 1, 1, 128, 1024)
    workload = one_config_workload(30_000, config, work=1e9)
    workload.running = {i: RunningState(elapsed_s=330.0) for i in range(len(workload))}
    plan = build_plan(workload, prepare_catalog([config], RuleModels(p_fail_valid=0.5)), mixed_cluster(), 3)
    assert plan.fails.mean() == pytest.approx(1 / 3, abs=0.01)
    assert plan.hold_s[plan.fails].min() >= 0.0 and plan.hold_s[plan.fails].max() <= 270.0
    assert plan.hold_s[plan.fails].mean() == pytest.approx(135.0, rel=0.03)


def test_a_running_job_draws_the_power_it_reports() -> None:
    """A running job's measured power replaces the model's for the rest of its run, in every run and
    whatever the power model's error; a running job that reported none (0 W), and a queued one, keep the
    model's."""
    from tests.twin.test_power_error import POWER_W, PowerErrorModels

    config = JobConfig("llama3-8b", "lora", A100, 1, 1, 8, 1024)
    workload = one_config_workload(3, config, work=1e6)
    workload.running = {
        0: RunningState(elapsed_s=300.0, tokens_done=6e5, tokens_per_second=2000.0, power_w=412.5),
        1: RunningState(elapsed_s=300.0, power_w=0.0),  # no measurement (what an idle meter reports)
    }
    catalog = prepare_catalog(workload.catalog, PowerErrorModels(0.5))

    def power_by_row(plan: JobPlan) -> np.ndarray:
        out = np.empty(len(plan.row))
        out[plan.row] = plan.power_w
        return out

    for key in range(1, 6):
        by_row = power_by_row(build_plan(workload, catalog, mixed_cluster(), key))
        assert by_row[0] == 412.5
        assert by_row[1] != POWER_W and by_row[2] != POWER_W  # drawn about the model's 300 W
    known = prepare_catalog(workload.catalog, RuleModels())
    assert power_by_row(build_plan(workload, known, mixed_cluster(), 1)).tolist() == [412.5, 300.0, 300.0]


def test_a_catalog_prepared_from_a_known_one_equals_one_prepared_anew(calibrated_models_dir: Path) -> None:
    """The calibrated models on the sample's configurations, every column (members, error quantiles,
    correlations, ranges, power error): a what-if's catalog prepared from its baseline's (some of its
    configurations capped, repaired, optimized or new) equals, bit for bit, the catalog prepared anew."""
    models = ModelRegistry(calibrated_models_dir).load_in_use()[1]  # type: ignore[index]
    rows = load_benchmark(bundled_benchmark_path()).head(600)
    configs = [config_from_row(row) for _, row in rows.iterrows()]
    capped = [c.with_changes(batch_size=1) if c.batch_size > 64 else c for c in configs]
    scenario = capped[:500] + [
        c.with_changes(tokens_per_sample=c.tokens_per_sample + 1) for c in configs[500:]
    ]
    every_change = PlanOptions(admission=Admission.REPAIR, optimizations=frozenset(Optimization))
    for known_plan, plan in (
        (PlanOptions(), PlanOptions()),
        (PlanOptions(), every_change),
        (PlanOptions(Admission.REPAIR), PlanOptions(Admission.REJECT)),  # as a plan's (twin.capacity)
        (PlanOptions(Admission.REJECT), PlanOptions()),  # the known rows' predicted failures are not carried
    ):
        known = prepare_catalog(configs, models, known_plan)
        again = prepare_catalog(scenario, models, plan)
        reused = prepare_catalog(scenario, models, plan, known)
        for column in fields(PreparedCatalog):
            a, b = getattr(again, column.name), getattr(reused, column.name)
            if column.name == "configs":
                assert a == b
            else:
                assert a is not None and a.dtype == b.dtype, column.name
                assert np.array_equal(a, b, equal_nan=True), column.name


def test_what_a_known_catalog_holds_is_copied_not_asked_again(models: RuleModels) -> None:
    """The rows of the very configurations the known catalog holds are its rows (here made wrong on purpose
    to show it); an equal configuration made anew is asked again (equality leaves out `extra`, which the
    models may read)."""
    config = JobConfig("llama3-8b", "lora", A100, 2, 1, 8, 1024)
    known = prepare_catalog([config], models)
    known.throughput[:] = 1.0
    equal_but_new = config.with_changes(batch_size=8)
    assert equal_but_new == config and equal_but_new is not config
    reused = prepare_catalog([config, equal_but_new], models, known=known)
    assert reused.throughput[0].tolist() == [1.0, 1.0, 1.0]
    assert reused.throughput[1].tolist() == prepare_catalog([config], models).throughput[0].tolist()
