"""Ensembles, forecasts and what-ifs: seeded, paired, and the same on one process or two."""

from __future__ import annotations

import numpy as np
import pytest

from tests.twin.conftest import A100, RuleModels, config_workload, mixed_cluster
from twin.arrivals import ArrivalModel
from twin.ensemble import run_ensemble, run_ensembles
from twin.executors import LocalExecutor
from twin.forecast import ForecastOptions, TwinInputs, forecast, make_spec
from twin.run_metrics import SERIES_FIGURES, SUMMARY_FIGURES
from twin.slo_attainment import DEFAULT_SLOS, Slo, SloSet
from twin.whatif import NodeChange, ScenarioChanges, WhatIf, apply_changes, run_whatif
from twin.workload import RunningState


def live_like_inputs() -> TwinInputs:
    """Queued and running jobs now, and arrivals at ~40 jobs/hour drawn from the same kind of mix."""
    rng = np.random.default_rng(21)
    known = config_workload(rng, 60, 1.0)
    known.arrival_s = -known.arrival_s - 100.0  # submitted before the forecast starts
    known.running = {i: RunningState(elapsed_s=50.0 * i) for i in range(10)}
    mix = config_workload(rng, 200, 1.0)
    arrivals = ArrivalModel(hourly_rate=np.full(24, 40.0), mix=mix, start_hour=13.5)
    return TwinInputs(cluster=mixed_cluster(), workload=known, arrivals=arrivals)


def options(**changes: object) -> ForecastOptions:
    return ForecastOptions(horizon_s=6 * 3600.0, interval_s=1800.0, runs=6, seed=3, workers=1).with_changes(
        **changes
    )


def test_forecast_document_has_every_figure_with_its_spread(models: RuleModels) -> None:
    doc = forecast(live_like_inputs(), models, options())
    for name in SUMMARY_FIGURES:
        assert set(doc["summary"][name]) == {"mean", "p10", "p90"}
        spread = doc["summary"][name]
        assert spread["p10"] <= spread["mean"] <= spread["p90"] or spread["p10"] == spread["p90"]
    assert set(doc["summary"]["utilization_by_type"]) == {A100, "L40S"}
    assert len(doc["series"]["t_s"]) == 12
    for name in SERIES_FIGURES:
        assert len(doc["series"][name]["mean"]) == 12
    assert len(doc["series"]["utilization_by_type"]["L40S"]["p90"]) == 12
    assert [s["name"] for s in doc["slos"]] == [s.name for s in DEFAULT_SLOS.slos]
    for slo in doc["slos"]:
        assert 0.0 <= slo["probability_met"] <= 1.0
    # Arrivals came in on top of the 60 known jobs: about 40/hour for 6 hours.
    assert 60 + 150 < doc["summary"]["jobs"]["mean"] < 60 + 330
    assert doc["known_jobs"] == {"total": 60, "running": 10, "queued": 50}


def test_forecast_is_seeded_and_the_same_on_two_processes(models: RuleModels) -> None:
    inputs = live_like_inputs()
    one = forecast(inputs, models, options())
    again = forecast(inputs, models, options())
    two = forecast(inputs, models, options(workers=2))
    other = forecast(inputs, models, options(seed=4))
    for doc in (again, two):
        assert (
            doc["summary"] == one["summary"] and doc["series"] == one["series"] and doc["slos"] == one["slos"]
        )
    assert other["summary"] != one["summary"]


def test_an_empty_scenario_differs_by_exactly_zero(models: RuleModels) -> None:
    whatif = WhatIf(horizon="6h", interval="30m", runs=5, seed=9, policy="fifo")
    doc = run_whatif(live_like_inputs(), models, whatif, workers=1)
    for name in SUMMARY_FIGURES:
        diff = doc["difference"][name]
        assert (
            diff["mean"] == 0.0 and diff["p10"] == 0.0 and diff["p90"] == 0.0 and diff["ci95"] == [0.0, 0.0]
        )
    assert doc["baseline"]["summary"] == doc["scenario"]["summary"]


def test_more_nodes_cut_the_wait_and_the_interval_says_so(models: RuleModels) -> None:
    changes = ScenarioChanges(nodes=[NodeChange(gpu_model="A100-SXM", add=4)])
    whatif = WhatIf(horizon="6h", interval="1h", runs=8, seed=1, changes=changes)
    inputs = live_like_inputs()
    inputs.arrivals = ArrivalModel(np.full(24, 90.0), inputs.arrivals.mix, 0.0)  # congested
    doc = run_whatif(inputs, models, whatif, workers=1)
    wait = doc["difference"]["wait_mean_s"]
    assert wait["mean"] < 0 and wait["ci95"][1] < 0
    # Paired seeds: every run saw the same arrivals, so the job count does not move at all.
    assert doc["difference"]["jobs"]["mean"] == 0.0 and doc["difference"]["jobs"]["ci95"] == [0.0, 0.0]
    assert (
        doc["scenario"]["cluster"]["gpus_by_model"][A100]
        == doc["baseline"]["cluster"]["gpus_by_model"][A100] + 32
    )


def test_cancelling_running_jobs_frees_their_gpus_for_the_queue(models: RuleModels) -> None:
    """A stalled job's cancellation, as steering weighs it: the queue behind it waits less; every other job
    keeps its draws (paired by job id, not by row), so the jobs known after it are not reshuffled."""
    inputs = live_like_inputs()
    running = [inputs.workload.job_ids[row] for row in sorted(inputs.workload.running)]
    whatif = WhatIf(horizon="6h", interval="1h", runs=6, seed=2, changes=ScenarioChanges(cancel_jobs=running))
    doc = run_whatif(inputs, models, whatif, workers=1)
    assert doc["scenario"]["known_jobs"] == {"total": 50, "running": 0, "queued": 50}
    wait = doc["difference"]["wait_mean_s"]
    assert wait["mean"] < 0 and wait["ci95"][1] < 0
    assert doc["difference"]["jobs"]["mean"] == -10.0  # the ten cancelled, every run
    one = run_whatif(inputs, models, whatif.model_copy(update={"changes": ScenarioChanges(
        cancel_jobs=running[:1])}), workers=1)  # fmt: skip
    assert one["scenario"]["known_jobs"]["running"] == 9


def test_cancelling_a_job_that_is_not_known_is_refused_by_name(models: RuleModels) -> None:
    whatif = WhatIf(horizon="1h", runs=1, changes=ScenarioChanges(cancel_jobs=["job-0", "gone-1", "gone-2"]))
    inputs = live_like_inputs()
    assert "job-0" in inputs.workload.job_ids
    with pytest.raises(ValueError, match="cancel_jobs: 'gone-1', 'gone-2' not among the known jobs"):
        run_whatif(inputs, models, whatif, workers=1)
    with pytest.raises(ValueError, match="at least 1 character"):
        ScenarioChanges.model_validate({"cancel_jobs": [""]})
    with pytest.raises(ValueError, match="NUL character"):
        ScenarioChanges.model_validate({"cancel_jobs": ["job\x000"]})


def test_a_workload_without_some_jobs_keeps_the_rest_as_they_were() -> None:
    known = live_like_inputs().workload
    gone = {known.job_ids[0], known.job_ids[3], known.job_ids[20]}
    rest = known.without(gone)
    kept = [row for row, job_id in enumerate(known.job_ids) if job_id not in gone]
    assert rest.job_ids == [known.job_ids[row] for row in kept]
    assert rest.arrival_s.tolist() == known.arrival_s[kept].tolist()
    assert [rest.config_of(new) for new in range(len(rest))] == [known.config_of(row) for row in kept]
    # Running rows renumbered with their jobs: row 4 of the original (elapsed 200 s) is row 2 now.
    assert {rest.job_ids[row]: state.elapsed_s for row, state in rest.running.items()} == {
        known.job_ids[row]: known.running[row].elapsed_s for row in known.running if row in kept
    }
    assert rest.running[2].elapsed_s == 200.0


def test_admission_reject_trades_failures_for_rejections(models: RuleModels) -> None:
    whatif = WhatIf(horizon="6h", runs=4, changes=ScenarioChanges(admission="reject"))
    doc = run_whatif(live_like_inputs(), models, whatif, workers=1)
    assert doc["baseline"]["summary"]["jobs_failed"]["mean"] > 0
    assert (
        doc["scenario"]["summary"]["failed_gpu_hours"]["mean"]
        < doc["baseline"]["summary"]["failed_gpu_hours"]["mean"]
    )
    assert doc["difference"]["jobs_rejected"]["mean"] > 0


def test_slo_attainment_follows_its_bound(models: RuleModels) -> None:
    generous = SloSet(
        slos=[Slo(name="wait", metric="wait_p95_s", max=1e9), Slo(name="util", metric="utilization", min=1.0)]
    )
    doc = forecast(live_like_inputs(), models, options(), generous)
    assert doc["slos"][0]["probability_met"] == 1.0 and doc["slos"][0]["attainment"]["mean"] == 1.0
    assert doc["slos"][1]["probability_met"] == 0.0 and doc["slos"][1]["attainment"]["mean"] == 0.0
    per_type = SloSet(slos=[Slo(name="l40s busy", metric="utilization", gpu_model="L40S", min=0.0)])
    doc_type = forecast(live_like_inputs(), models, options(), per_type)
    assert doc_type["slos"][0]["value"]["mean"] == doc_type["summary"]["utilization_by_type"]["L40S"]["mean"]
    with pytest.raises(ValueError):
        Slo(name="bad", metric="wait_p95_s", max=1.0, min=0.0)
    # Per interval: the share of runs in which each SLO held.
    assert set(doc["series"]["slo_attainment"]["util"]["mean"]) == {0.0}
    assert set(doc["series"]["slo_attainment"]["wait"]["mean"]) <= {1.0, None}


def test_whatif_rejects_bad_bodies() -> None:
    with pytest.raises(ValueError):
        WhatIf(horizon="soon")
    with pytest.raises(ValueError):
        WhatIf(changes={"nodes": [{"gpu_model": "L40S", "add": -1}]})
    with pytest.raises(ValueError):
        WhatIf(changes={"policy": "lottery"})
    with pytest.raises(ValueError):
        WhatIf(runs=0)


def test_ensembles_run_as_one_batch_give_each_ensembles_runs(models: RuleModels) -> None:
    """`run_ensembles` on a pool of two: run for run, the figures of `run_ensemble` in this process (the
    series are left out), for every spec, in the specs' order; progress once per run."""
    inputs = live_like_inputs()
    bigger, _ = apply_changes(inputs, options(), ScenarioChanges(nodes=[NodeChange(gpu_model=A100, add=1)]))
    specs = [make_spec(inputs, models, options()), make_spec(bigger, models, options(policy="backfill"))]
    finished: list[int] = []
    batched = run_ensembles(specs, 3, LocalExecutor(2), progress=lambda: finished.append(1))
    assert len(finished) == 2 * 3
    for spec, runs in zip(specs, batched, strict=True):
        alone = run_ensemble(spec, 3, workers=1)
        for figures in ("summary", "slos", "utilization_by_type"):  # repr: NaN (no value) equals NaN
            assert repr([getattr(r, figures) for r in runs]) == repr([getattr(r, figures) for r in alone])
        assert all(not r.series and not len(r.edges_s) for r in runs)
    assert batched[0][0].summary != batched[1][0].summary  # the second spec really is another cluster


def test_a_batch_stops_when_its_progress_raises(models: RuleModels) -> None:
    specs = [make_spec(live_like_inputs(), models, options())] * 4

    def stop() -> None:
        raise KeyboardInterrupt  # what the API's check raises is its own; any exception stops the batch

    with pytest.raises(KeyboardInterrupt):
        run_ensembles(specs, 6, LocalExecutor(2), progress=stop)
