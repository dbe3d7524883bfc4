"""Job advice: the rules and repairs exactly, the choices against a trend-following stand-in for the
models (unit level), the evidence against the paper's published figures, and the HTTP boundary."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from advisor import findings
from advisor.advice import advise_job, advise_many
from advisor.advice_answer import RECOMMEND_P_VALID
from advisor.advice_options import NEAR_BEST
from advisor.advice_schemas import AdviceOut
from advisor.advice_text import _run_time, render_text
from advisor.candidates import repair
from tests.advisor.conftest import FINETWIN
from tests.advisor.fakes import FakeInUse, FakeModels
from tests.conftest import SHARED_REFERENCE
from twin.domain import JobConfig, config_rule, nearest_multiple
from twin.limits import STORE_INT_MAX

A100 = "NVIDIA-A100-SXM4-80GB"


def job(**changes: object) -> JobConfig:
    base = JobConfig(
        model_name="llama3-8b", method="lora", gpu_model=A100, number_gpus=4, number_nodes=1,
        batch_size=16, tokens_per_sample=2048,
    )  # fmt: skip
    return base.with_changes(**changes)


@pytest.mark.parametrize(
    ("value", "step", "expected"), [(6, 4, 8), (5, 4, 4), (1, 8, 8), (13, 4, 12), (30, 8, 32), (16, 8, 16)]
)
def test_nearest_multiple(value: int, step: int, expected: int) -> None:
    assert nearest_multiple(value, step) == expected


def test_a_job_as_large_as_the_store_holds_gets_an_answer() -> None:
    """The configuration's bounds are the store's (2^31 - 1, a prime): repairing its nodes must not search
    every count up to it, and the answer must come back (the models say whether it would run)."""
    huge = job(number_gpus=STORE_INT_MAX, number_nodes=3, batch_size=STORE_INT_MAX)
    answer = advise_job(huge, None, FakeModels())
    assert answer.verdict.status == "rejected" and answer.repair is not None
    assert answer.repair.config.number_nodes == STORE_INT_MAX  # a prime: one GPU per node


def test_repair_fixes_each_rule_nearest_first() -> None:
    fixed, changes = repair(job(batch_size=10, number_gpus=4))
    assert (fixed.batch_size, [c.field for c in changes]) == (12, ["batch_size"])
    moe = job(model_name="mixtral-8x7b-instruct-v0.1", number_gpus=6, batch_size=24, fast_moe=4)
    fixed, changes = repair(moe)
    assert fixed.number_gpus == 8 and fixed.batch_size == 24 and config_rule(fixed) is None
    assert [c.field for c in changes] == ["number_gpus"]
    fixed, changes = repair(job(number_gpus=12, number_nodes=5, batch_size=24))
    assert (fixed.number_nodes, config_rule(fixed)) == (4, None)  # the nearest to 5 of 2, 3, 4, 6, 12
    assert repair(job()) == (job(), [])


def test_a_rejected_config_gets_the_rule_and_a_repair() -> None:
    models = FakeModels()
    answer = advise_job(job(batch_size=6), 1e8, models)
    assert answer.verdict.status == "rejected"
    assert answer.verdict.rule == "batch_size_not_multiple_of_gpus"
    assert answer.repair is not None and answer.repair.config.batch_size == 8
    assert answer.repair.prediction is not None and answer.repair.prediction.p_valid is not None
    cited = answer.verdict.evidence[0].paper
    assert cited["rejection_rules.batch_size_not_multiple_of_gpus"] == 5360


def test_every_candidate_is_predicted_in_one_call() -> None:
    models = FakeModels()
    advise_job(
        job(model_name="mixtral-8x7b-instruct-v0.1", number_gpus=16, number_nodes=2, batch_size=64),
        1e9,
        models,
    )
    assert models.calls == {"throughput": 1, "failure": 1, "power": 1}
    assert models.rows_seen > 50  # the grid, the ladder and the variants, together


def test_options_are_likely_to_run_and_prefer_moderate_batches() -> None:
    answer = advise_job(job(batch_size=16), 1e9, FakeModels())
    best = answer.best_throughput
    assert best is not None and best.prediction.p_valid is not None
    assert best.prediction.p_valid >= RECOMMEND_P_VALID
    right_sizing = next(e for e in best.evidence if e.finding == "F3")
    # A larger batch would add little (logarithmic growth) or is not likely to run.
    gain = right_sizing.predicted["largest_batch_gain"]
    if right_sizing.predicted["largest_batch"] > best.config.batch_size:
        assert gain < 1 + NEAR_BEST or right_sizing.predicted["largest_batch_p_valid"] < RECOMMEND_P_VALID
    assert best.config.batch_size / best.config.number_gpus <= 32  # not past the knee of the curve
    cost = answer.best_cost
    assert cost is not None and cost.prediction.gpu_hours is not None
    risk_adjusted = cost.prediction.gpu_hours / cost.prediction.p_valid  # type: ignore[operator]
    assert risk_adjusted <= (1 + NEAR_BEST) * best.prediction.gpu_hours / best.prediction.p_valid  # type: ignore[operator]
    band = best.prediction.tokens_per_second
    assert band is not None and band.p10 <= band.p50 <= band.p90
    run = best.prediction.run_time_s
    assert run is not None and run.p50 == pytest.approx(1e9 / band.p50)
    assert best.workers * best.gpus_per_worker == best.config.number_gpus and best.gpus_per_worker <= 8


def test_a_time_limit_caps_run_times_gpu_hours_and_energy_and_says_so() -> None:
    """The run stops at its time limit, as the twin runs it: its run time, GPU-hours and energy were those of
    the whole work (22.7 h and 90.7 GPU-h for a job capped at 600 s)."""
    uncapped = advise_job(job(), 1e9, FakeModels())
    capped = advise_job(job(time_limit_s=600.0), 1e9, FakeModels())
    assert capped.verdict.prediction is not None and uncapped.verdict.prediction is not None
    run, free = capped.verdict.prediction.run_time_s, uncapped.verdict.prediction.run_time_s
    assert run is not None and free is not None and free.p10 > 600
    assert (run.p10, run.p50, run.p90) == (600.0, 600.0, 600.0)
    assert capped.verdict.prediction.gpu_hours == pytest.approx(4 * 600 / 3600)
    assert capped.verdict.prediction.energy_kwh == pytest.approx(300.0 * 4 * 600 / 3600 / 1000)
    options = [capped.fewest_gpus, capped.best_throughput, capped.best_cost]
    assert all(o is not None and o.prediction.run_time_s.p90 <= 600 for o in options)  # type: ignore[union-attr]
    (note,) = [n for n in capped.notes if "time_limit_s" in n]
    tps = capped.verdict.prediction.tokens_per_second
    assert tps is not None and f"processes {tps.p50 * 600:,.0f} of the 1,000,000,000 tokens" in note
    assert not any("time_limit_s" in n for n in uncapped.notes)
    assert "as asked: " in render_text(capped) and ", 10 min, 0.7 GPU-h" in render_text(capped)
    # A limit the run ends before changes nothing.
    roomy = advise_job(job(time_limit_s=free.p90 + 1), 1e9, FakeModels())
    assert roomy.verdict.prediction == uncapped.verdict.prediction
    assert not any("time_limit_s" in n for n in roomy.notes)


def test_fewest_gpus_for_a_model_that_does_not_fit_one() -> None:
    answer = advise_job(job(model_name="llama3.1-70b", method="full", batch_size=32), 1e9, FakeModels())
    fewest = answer.fewest_gpus
    assert fewest is not None and fewest.config.number_gpus > 1 and fewest.config.batch_size == 32
    tried = fewest.evidence[0].predicted["p_valid_by_gpus"]
    assert all(p < RECOMMEND_P_VALID for g, p in tried.items() if int(g) < fewest.config.number_gpus)
    assert answer.verdict.status == "likely_oom" and answer.verdict.p_oom > 0.5


class _NothingRuns(FakeModels):
    """No configuration is likely to run; 16 GPUs at batch 64 comes closest."""

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        super().predict_failure(configs)
        return np.array([0.6 if (c.number_gpus, c.batch_size) == (16, 64) else 0.2 for c in configs])


def test_when_nothing_is_likely_to_run_the_answer_says_what_was_searched_and_what_came_closest() -> None:
    answer = advise_job(job(model_name="llama3.1-70b", method="full", batch_size=32), 1e9, _NothingRuns())
    assert answer.fewest_gpus is None and answer.best_throughput is None and answer.best_cost is None
    note = next(n for n in answer.notes if n.startswith("none of the"))
    assert "configurations searched (1-32 GPUs on up to 4 node(s), batch 1-1,024," in note, note
    assert "the likeliest, 16 GPU(s) at batch 64, runs with p = 0.60 (at least 0.60" in note, note
    # Where an option exists, no such note.
    assert not any(n.startswith("none of the") for n in advise_job(job(), 1e9, FakeModels()).notes)


class _Unsure(FakeModels):
    """Every configuration likely to run (p = 0.95), none as surely as the test asks (0.99)."""

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        super().predict_failure(configs)
        return np.full(len(configs), 0.95)


def test_when_runs_are_likely_but_none_sure_enough_the_answer_says_that_and_not_unlikely() -> None:
    """It said "runs with probability 1.00" and "none of the 64 configurations searched is likely to run" of
    the same configuration: the bound, not the chance, was what fell short."""
    (answer,) = advise_many([(job(), 1e9)], _Unsure(), min_p_valid_low=0.99)
    assert isinstance(answer, AdviceOut) and answer.fewest_gpus is None and answer.best_cost is None
    assert answer.verdict.message.endswith(
        "runs with probability 0.95, but only at least 0.95 with 95 % confidence: the failure model is "
        "unsure of configurations like it (a recommendation needs 0.99)"
    ), answer.verdict.message
    note = next(n for n in answer.notes if n.startswith("none of the"))
    assert "is sure enough to recommend:" in note and "is likely to run;" not in note, note
    assert "the safest, 1 GPU(s) at batch" in note and "runs with p = 0.95 but only at least 0.95" in note, (
        note
    )
    assert "fewest GPUs: none recommended (see the note)" in render_text(answer)
    # A bound that is met says nothing more.
    (sure,) = advise_many([(job(), 1e9)], _Unsure(), min_p_valid_low=0.9)
    assert isinstance(sure, AdviceOut) and sure.verdict.message.endswith("runs with probability 0.95")


def test_placement_and_optimizations() -> None:
    answer = advise_job(job(number_gpus=8, number_nodes=2, batch_size=32), None, FakeModels())
    assert answer.placement.single_node and answer.placement.number_nodes == 1
    assert answer.work.assumed and any("dataset_tokens" in n for n in answer.notes)
    opts = {o.name: o for o in answer.optimizations}
    assert opts["fast_kernels"].recommended and opts["fast_kernels"].predicted_speedup == pytest.approx(1.12)
    assert not opts["fast_moe"].recommended and not opts["enable_roce"].recommended
    multi = advise_job(job(number_gpus=16, number_nodes=2, batch_size=64), 1e9, FakeModels())
    roce = {o.name: o for o in multi.optimizations}["enable_roce"]
    assert roce.recommended and roce.predicted_speedup == pytest.approx(1.9)
    moe = advise_job(
        job(model_name="mixtral-8x7b-instruct-v0.1", fast_moe=4, batch_size=16), 1e9, FakeModels()
    )
    fast_moe = {o.name: o for o in moe.optimizations}["fast_moe"]
    assert fast_moe.recommended and fast_moe.setting == 1
    assert fast_moe.evidence[0].paper["optimizations.fast_moe_speedup_ep1"] == 1.69


def test_the_cited_numbers_are_the_published_ones() -> None:
    path = SHARED_REFERENCE / "paper_figures.json"
    if not path.exists():
        pytest.skip(f"{path} not available")
    published = json.loads(path.read_text())
    for finding in findings.ALL:
        for key, value in finding.values.items():
            assert findings.lookup(published, key) == value, (finding.id, key)


# --- HTTP ---------------------------------------------------------------------------------------------------

BODY = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": "A100-SXM", "number_gpus": 4, "batch_size": 6,
    "tokens_per_sample": 2048, "dataset_tokens": 1e9,
}  # fmt: skip


def test_advise_over_http(client: TestClient, keys: dict, in_use: FakeInUse) -> None:
    models = FakeModels()
    in_use.models = models
    assert client.post("/v1/advise", json=BODY).status_code == 401
    response = client.post("/v1/advise", json=BODY, headers=keys["viewer"])  # computes only: a viewer may ask
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model_version"] == "v-test" and answer["verdict"]["status"] == "rejected"
    assert answer["config"]["gpu_model"] == A100  # the paper's short name is accepted
    calls = dict(models.calls)
    again = client.post("/v1/advise", json=BODY, headers=keys["viewer"])
    assert again.content == response.content and models.calls == calls  # answered from the cache
    in_use.version = "v-next"
    newer = client.post("/v1/advise", json=BODY, headers=keys["viewer"]).json()
    assert newer["model_version"] == "v-next" and models.calls["throughput"] == calls["throughput"] + 1


def test_advice_is_asked_with_the_runs_protocol_and_capped_at_its_time_limit(
    client: TestClient, keys: dict, in_use: FakeInUse
) -> None:
    """`POST /v1/predict` takes the benchmark's descriptors of the run, which the models' protocol features
    read; advice refused them (422), so a question about a time-capped protocol was answered as one of no
    known protocol, its run times uncapped."""
    models = FakeModels()
    in_use.models = models
    protocol = {
        "experiment_id": "SFTTrainer.finetune-stop_after_seconds.600-v1.0.0",
        "torch_dtype": "float16",
    }
    body = {**BODY, "batch_size": 8, "dataset_tokens": 1e10, **protocol}
    response = client.post("/v1/advise", json=body, headers=keys["viewer"])
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["config"]["time_limit_s"] == 600  # as the loader reads the protocol of a benchmark row
    assert answer["verdict"]["prediction"]["run_time_s"]["p90"] == 600
    assert protocol in models.protocols_seen and {} not in models.protocols_seen
    # A time limit given beside the protocol is the one that holds.
    capped = client.post("/v1/advise", json={**body, "time_limit_s": 300}, headers=keys["viewer"]).json()
    assert capped["config"]["time_limit_s"] == 300


@pytest.mark.parametrize("cap", ["0", "0.0", "1" + "0" * 400, "2000000000"])
def test_a_protocols_cap_that_no_run_could_have_caps_nothing(
    client: TestClient, keys: dict, in_use: FakeInUse, cap: str
) -> None:
    """A cap of 0 s, or past the contract's 1e9 s (400 digits read as infinity: the answer was not JSON),
    is no cap: the run is advised as uncapped, as a time_limit_s of that size is refused."""
    in_use.models = FakeModels()
    body = {**BODY, "experiment_id": f"SFTTrainer.finetune-stop_after_seconds.{cap}-v1.0.0"}
    response = client.post("/v1/advise", json=body, headers=keys["viewer"])
    assert response.status_code == 200, response.text
    assert response.json()["config"]["time_limit_s"] is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"gpu_model": "TPU-v9"}, "gpu_model"),
        ({"batch_size": 0}, "batch_size"),
        ({"method": "qlora"}, "method"),
        ({"number_gpus": "four"}, "number_gpus"),
        ({"surprise": 1}, "surprise"),
        ({"dataset_tokens": -5}, "dataset_tokens"),
    ],
)
def test_bad_advice_requests_get_a_422_naming_the_field(
    client: TestClient, keys: dict, in_use: FakeInUse, change: dict, field: str
) -> None:
    in_use.models = FakeModels()
    response = client.post("/v1/advise", json={**BODY, **change}, headers=keys["viewer"])
    assert response.status_code == 422 and field in response.json()["detail"]


def test_advise_without_models_is_a_409(client: TestClient, keys: dict, in_use: FakeInUse) -> None:
    assert in_use.models is None
    response = client.post("/v1/advise", json=BODY, headers=keys["viewer"])
    assert response.status_code == 409 and "calibrate" in response.json()["detail"]


def test_advise_cli_reports_bad_files(tmp_path: Path) -> None:
    import subprocess

    bad = tmp_path / "job.yaml"
    bad.write_text("model_name: llama3-8b\nmethod: lora\ngpu_model: A100-SXM\nnumber_gpus: 0\n")
    env = {"FINETWIN_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*FINETWIN, "advise", str(bad)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "number_gpus" in done.stderr and str(bad) in done.stderr
    broken = tmp_path / "job.json"
    broken.write_text('{"model_name": ')
    done = subprocess.run([*FINETWIN, "advise", str(broken)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "not valid JSON" in done.stderr


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(2.02, "2.02 s"), (90.0, "90 s"), (600.0, "10 min"), (7200.0, "2.00 h"), (81648.0, "22.68 h")],
)
def test_a_run_time_is_written_to_be_read_at_a_glance(seconds: float, text: str) -> None:
    """A run of 2 s read `0.00 h`."""
    assert _run_time(seconds) == text
