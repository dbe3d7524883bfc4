"""The calibrated models on the real benchmark sample: exact admission rules, a prediction for every row,
unseen model names, the physics the models must respect, and persistence through skops.

The models are the session's calibrated version (`models`, tests/calibrate/conftest.py): `finetwin calibrate`
on the whole sample, which predicts as `fit_models(sample, seed=0)` does (checked to 1e-9 relative), without
a fit of the module's own (20-30 s). Accuracy itself is measured in `bench/accuracy.py`, not here.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pytest
import skops.io as sio

from calibrate import compiled as compiled_trees
from calibrate import tree_walker
from calibrate.config_frame import configs_to_frame
from calibrate.features import DATA_SHEET_GPU_NOTE, UNKNOWN_GPU_NOTE, feature_columns
from calibrate.fit import (
    SKOPS_TRUSTED_TYPES,
    CalibratedModels,
    fit_models,
    holdout_metrics,
)
from calibrate.loader import CONFIG_COLUMNS, DISTINCT_FROM_ROWS, load_benchmark, load_configs
from calibrate.model_sizes import UNKNOWN_SIZE_NOTE, UNSEEN_NAME_NOTE
from twin.domain import GPU_TYPES, JobConfig, Outcome
from twin.job_config import config_from_row
from twin.protocols import JobModels

A100_SXM = "NVIDIA-A100-SXM4-80GB"
BAND = ["tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90"]


@pytest.fixture(scope="module")
def sample(sample_csv) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    return load_benchmark(sample_csv)


@pytest.fixture(scope="module")
def predicted(models: CalibratedModels, sample: pd.DataFrame) -> pd.DataFrame:
    return models.predict_frame(sample)


def job(**changes: object) -> JobConfig:
    base: dict[str, object] = {
        "model_name": "llama3.1-8b",
        "method": "full",
        "gpu_model": A100_SXM,
        "number_gpus": 1,
        "number_nodes": 1,
        "batch_size": 8,
        "tokens_per_sample": 2048,
    }
    return JobConfig(**(base | changes))  # type: ignore[arg-type]


def test_the_admission_rules_are_exact_on_every_real_row(
    sample: pd.DataFrame, predicted: pd.DataFrame
) -> None:
    assert (predicted["rule"].fillna("") == sample["rule"].fillna("")).all()
    rejected = sample["outcome"] == Outcome.REJECTED.value
    assert ((predicted["outcome"] == Outcome.REJECTED.value) == rejected).all()
    assert (predicted.loc[rejected, "p_valid"] == 0.0).all()
    assert rejected.sum() == 1299  # the sample's rejected rows, so the check above is not vacuous


def test_rows_that_pass_the_rules_are_predicted_alike_with_or_without_rejected_rows_beside_them(
    models: CalibratedModels, sample: pd.DataFrame
) -> None:
    """The failure model is asked only about runnable rows; a rejected row's p_valid and its bound are 0."""
    mixed = models.predict_columns(sample)
    rejected = mixed["outcome"] == Outcome.REJECTED.value
    assert 0 < rejected.sum() < len(sample)
    alone = models.predict_columns(sample[~rejected].reset_index(drop=True))
    for name in ("p_valid", "p_valid_low", "tokens_per_second_p50"):
        assert mixed[name][~rejected].tolist() == alone[name].tolist(), name
    assert (mixed["p_valid"][rejected] == 0).all() and (mixed["p_valid_low"][rejected] == 0).all()


def test_every_real_row_gets_a_complete_ordered_prediction(
    sample: pd.DataFrame, predicted: pd.DataFrame
) -> None:
    assert predicted.index.equals(sample.index)
    assert set(predicted["outcome"]) <= {o.value for o in Outcome}
    numbers = predicted[["p_valid", *BAND]]
    assert np.isfinite(numbers.to_numpy()).all()
    assert ((predicted["p_valid"] >= 0) & (predicted["p_valid"] <= 1)).all()
    p10, p50, p90 = (predicted[c].to_numpy() for c in BAND)
    assert (p10 > 0).all() and (p10 <= p50).all() and (p50 <= p90).all()
    assert (predicted["note"] == "").all()  # every model of the sample is known


def test_the_models_fit_the_sample_they_learned_from(sample: pd.DataFrame, predicted: pd.DataFrame) -> None:
    valid = (sample["outcome"] == Outcome.VALID.value).to_numpy()
    error = np.abs(predicted["tokens_per_second_p50"][valid] / sample["dataset_tokens_per_second"][valid] - 1)
    assert np.median(error) < 0.05
    passed = sample["outcome"] != Outcome.REJECTED.value
    agree = (predicted.loc[passed, "outcome"] == sample.loc[passed, "outcome"]).mean()
    assert agree > 0.95


def test_each_row_is_noted_for_its_llm_and_its_gpu(sample: pd.DataFrame) -> None:
    """The notes are joined once per distinct LLM and GPU pair, then given to the rows (from
    DISTINCT_FROM_ROWS rows on, where rows share their distinct values): every row gets its own pair's."""
    names = {"llama3.1-8b": "", "acme-1b-chat": UNSEEN_NAME_NOTE, "acme-chat": UNKNOWN_SIZE_NOTE}
    gpus = {A100_SXM: "", "NVIDIA L4": DATA_SHEET_GPU_NOTE, "acme-gpu": UNKNOWN_GPU_NOTE, "L40S": ""}
    pairs = [(n, g) for n in names for g in gpus]
    picked = np.random.default_rng(3).integers(0, len(pairs), size=DISTINCT_FROM_ROWS + 200)
    rows = sample[sample["model_name"] == "llama3.1-8b"].head(1)
    rows = rows.loc[rows.index.repeat(len(picked))].reset_index(drop=True)
    rows["model_name"] = [pairs[i][0] for i in picked]
    rows["gpu_model"] = [pairs[i][1] for i in picked]
    _, notes = feature_columns(rows)
    expected = ["; ".join(x for x in (names[pairs[i][0]], gpus[pairs[i][1]]) if x) for i in picked]
    assert notes == expected
    assert {UNSEEN_NAME_NOTE, f"{UNKNOWN_SIZE_NOTE}; {UNKNOWN_GPU_NOTE}", ""} <= set(notes)


def test_an_unseen_model_name_is_predicted_from_its_size_and_flagged(
    models: CalibratedModels, sample: pd.DataFrame
) -> None:
    rows = sample[sample["model_name"] == "llama3.1-8b"].head(20).copy()
    small, large, nameless = rows.copy(), rows.copy(), rows.copy()
    small["model_name"] = "acme-1b-chat"
    large["model_name"] = "acme-70b-chat"
    nameless["model_name"] = "acme-chat"
    out_small, out_large, out_nameless = (models.predict_frame(t) for t in (small, large, nameless))
    assert (out_small["note"] == UNSEEN_NAME_NOTE).all()
    assert (out_nameless["note"] == UNKNOWN_SIZE_NOTE).all()
    for out in (out_small, out_large, out_nameless):
        assert np.isfinite(out[["p_valid", *BAND]].to_numpy()).all()
    # A region the models never saw gets a wider band than the rows they learned from.
    seen = models.predict_frame(rows)
    width = out_large["tokens_per_second_p90"] / out_large["tokens_per_second_p10"]
    assert (width > seen["tokens_per_second_p90"] / seen["tokens_per_second_p10"]).all()
    # Size decides: the 70B model runs far slower and fails more than the 1B one in the same configuration.
    assert (out_large["tokens_per_second_p50"] < out_small["tokens_per_second_p50"] / 5).all()
    assert (out_large["p_valid"] <= out_small["p_valid"] + 1e-9).all()


def test_a_size_beyond_those_the_models_learned_from_is_flagged_as_extrapolated(
    models: CalibratedModels, sample: pd.DataFrame
) -> None:
    """65,536 GPUs read like any other answer (50 M tokens/s): the note now says it is extrapolated, for each
    size outside the training rows' range, beside any other note of the row."""
    learned = models.info["measured_ranges"]
    passed = sample[sample["outcome"] != Outcome.REJECTED.value]
    assert learned["number_gpus"] == [passed["number_gpus"].min(), passed["number_gpus"].max()]
    assert set(learned) == {"number_gpus", "number_nodes", "batch_size", "tokens_per_sample"}
    gpus_high = learned["number_gpus"][1]
    tokens_low, tokens_high = learned["tokens_per_sample"]
    configs = [
        job(),
        job(number_gpus=gpus_high * 2048, number_nodes=gpus_high * 256, batch_size=gpus_high * 2048),
        job(tokens_per_sample=tokens_high + 1),
        job(tokens_per_sample=tokens_low - 1, model_name="acme-8b"),
    ]
    notes = models.predict_frame(configs_to_frame(configs))["note"].fillna("").tolist()
    assert notes[0] == ""

    def beyond(name: str) -> str:
        low, high = learned[name]
        return f"{name} outside the {low:,}-{high:,} the models learned from"

    assert (
        notes[1]
        == "; ".join(beyond(n) for n in ("number_gpus", "number_nodes", "batch_size")) + ": extrapolated"
    )
    assert notes[2] == beyond("tokens_per_sample") + ": extrapolated"
    assert notes[3].startswith(f"{UNSEEN_NAME_NOTE}; tokens_per_sample outside"), notes[3]
    # A version saved before it kept ranges says nothing of them.
    older = CalibratedModels(models.encoding, models.throughput, models.failure, models.power, {})
    assert older.predict_frame(configs_to_frame(configs))["note"].fillna("").tolist()[:3] == ["", "", ""]


def test_throughput_grows_with_gpus_at_equal_batch_per_gpu_and_falls_with_model_size(
    models: CalibratedModels,
) -> None:
    by_gpus = models.predict_throughput([job(number_gpus=g, batch_size=4 * g) for g in (1, 2, 4, 8)])[:, 1]
    assert np.all(np.diff(by_gpus) > 0)
    assert by_gpus[-1] / by_gpus[0] > 4  # near-linear inside a node (paper: efficiency 0.94-1.00)
    sizes = ("llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b")
    by_size = models.predict_throughput([job(model_name=m, method="lora") for m in sizes])[:, 1]
    assert np.all(np.diff(by_size) < 0)


def test_more_gpus_sharding_the_state_never_lower_p_valid_of_a_memory_bound_job(
    models: CalibratedModels,
) -> None:
    # Full fine-tuning of a 70B model, one sample per GPU: FSDP spreads its ~1.1 TB of state over the GPUs.
    gpus = (1, 2, 4, 8, 16, 32)
    configs = [
        job(model_name="llama3.1-70b", number_gpus=g, number_nodes=max(1, g // 8), batch_size=g) for g in gpus
    ]
    p_valid = models.predict_failure(configs)
    assert np.all(np.diff(p_valid) >= -1e-9)
    assert p_valid[0] < 0.05  # 1.1 TB of state on one 80 GB GPU cannot run
    assert models.predict_failure([job(model_name="llama3.2-1b", method="lora", batch_size=1)])[0] > 0.9


def test_larger_batches_never_raise_p_valid(models: CalibratedModels) -> None:
    p_valid = models.predict_failure([job(number_gpus=4, batch_size=b) for b in (4, 16, 64, 256, 1024)])
    assert np.all(np.diff(p_valid) <= 1e-3)  # (the smallest probabilities wobble in the fifth decimal)
    assert p_valid[0] > 0.5 > p_valid[-1]


def test_job_configs_and_frames_go_through_the_same_features(
    models: CalibratedModels, sample: pd.DataFrame, predicted: pd.DataFrame
) -> None:
    assert isinstance(models, JobModels)
    rows = sample.iloc[::97]
    configs = [config_from_row(row) for _, row in rows.iterrows()]
    band = models.predict_throughput(configs)
    assert np.allclose(band, predicted.loc[rows.index, BAND].to_numpy())
    p_valid = models.predict_failure(configs)
    passed = (rows["outcome"] != Outcome.REJECTED.value).to_numpy()
    assert np.allclose(p_valid[passed], predicted.loc[rows.index, "p_valid"].to_numpy()[passed])


def test_columns_by_name_predict_what_the_frame_of_the_same_configs_predicts(
    models: CalibratedModels, sample: pd.DataFrame
) -> None:
    """The advice path (configs_to_columns -> predict_columns, no pandas) and the frame path agree on every
    number, rejected rows, unseen names and their notes included."""
    from calibrate.config_frame import configs_to_columns, configs_to_frame

    rows = sample.iloc[::41]
    configs = [config_from_row(row) for _, row in rows.iterrows()]
    configs.append(JobConfig("acme-13b-chat", "lora", "L40S", 3, 1, 8, 1024))  # unseen, and rejected
    framed = models.predict_frame(configs_to_frame(configs), power=True)
    columns = models.predict_columns(configs_to_columns(configs), power=True)
    assert list(columns["outcome"]) == list(framed["outcome"]) and "rejected" in set(framed["outcome"])
    assert list(columns["note"]) == list(framed["note"]) and columns["note"][-1]
    assert [r for r in columns["rule"]] == [r if isinstance(r, str) else None for r in framed["rule"]]
    for name in ("p_valid", "p_valid_low", *BAND, "power_watts"):
        np.testing.assert_array_equal(np.asarray(columns[name], dtype=float), framed[name].to_numpy(float))


def test_power_is_positive_and_falls_back_to_a_share_of_tdp_without_telemetry(
    models: CalibratedModels,
) -> None:
    gpus = list(GPU_TYPES)
    watts = models.predict_power_watts([job(gpu_model=g) for g in gpus])
    tdp = np.array([GPU_TYPES[g].tdp_watts for g in gpus])
    assert np.all(watts > 0) and np.all(watts <= 1.3 * tdp)
    pcie = gpus.index("NVIDIA-A100-80GB-PCIe")  # the sample has no power telemetry for it
    assert watts[pcie] == pytest.approx(tdp[pcie] * models.power.tdp_fraction)


def test_a_configs_csv_is_predicted_row_for_row(models: CalibratedModels, sample_csv, tmp_path) -> None:  # type: ignore[no-untyped-def]
    configs_only = pd.read_csv(sample_csv, dtype=str, keep_default_na=False)[list(CONFIG_COLUMNS)].iloc[:50]
    path = tmp_path / "configs.csv"
    configs_only.to_csv(path, index=False)
    table = load_configs(path)
    out = models.predict_frame(table)
    assert len(out) == 50 and out.index.equals(table.index)
    assert np.isfinite(out[BAND].to_numpy()).all()


def test_parts_survive_skops_and_json_with_identical_predictions(
    models: CalibratedModels, sample: pd.DataFrame, predicted: pd.DataFrame
) -> None:
    estimators, params = models.to_parts()
    stored = {}
    for name, estimator in estimators.items():
        blob = sio.dumps(estimator)
        assert set(sio.get_untrusted_types(data=blob)) <= set(SKOPS_TRUSTED_TYPES), name
        stored[name] = sio.loads(blob, trusted=list(SKOPS_TRUSTED_TYPES))
    text = io.StringIO()
    json.dump(params, text, allow_nan=False)
    restored = CalibratedModels.from_parts(stored, json.loads(text.getvalue()))
    again = restored.predict_frame(sample)
    pd.testing.assert_frame_equal(again, predicted)
    assert restored.feature_names == models.feature_names


def test_from_parts_refuses_missing_estimators(models: CalibratedModels) -> None:
    estimators, params = models.to_parts()
    del estimators["failure_0"]
    with pytest.raises(ValueError, match="failure_0"):
        CalibratedModels.from_parts(estimators, params)


def test_bad_configurations_name_the_column(models: CalibratedModels, sample: pd.DataFrame) -> None:
    bad = sample.head(3).copy()
    bad["method"] = ["full", "qlora", "lora"]
    with pytest.raises(ValueError, match=r"row 1: column 'method'"):
        models.predict_frame(bad)
    bad = sample.head(3).copy()
    bad.loc[bad.index[2], "tokens_per_sample"] = 0
    with pytest.raises(ValueError, match=r"row 2: column 'tokens_per_sample'"):
        models.predict_frame(bad)


def test_heavier_observed_runs_pull_the_throughput_towards_them(sample: pd.DataFrame) -> None:
    table = sample.iloc[::3]
    valid = table[table["outcome"] == Outcome.VALID.value]
    observed = valid[valid["model_name"] == "mistral-7b-v0.1"].copy()
    observed["dataset_tokens_per_second"] *= 2.0  # the cluster runs this model twice as fast as the benchmark
    combined = pd.concat([table, observed], ignore_index=True)
    equal = fit_models(combined, seed=0).predict_frame(observed)["tokens_per_second_p50"]
    weight = np.r_[np.ones(len(table)), np.full(len(observed), 20.0)]
    heavier = fit_models(combined, weight, seed=0).predict_frame(observed)["tokens_per_second_p50"]
    assert len(observed) >= 10
    assert np.median(heavier / observed["dataset_tokens_per_second"]) > 0.9
    assert np.median(heavier / equal) > 1.15


@pytest.mark.slow
def test_holdout_metrics_are_deterministic_for_a_seed(sample: pd.DataFrame) -> None:
    table = sample.iloc[::3]  # a third of the sample keeps this quick; determinism does not depend on size
    first = holdout_metrics(table, seed=3)
    second = holdout_metrics(table, seed=3)
    assert first == second
    for key in ("throughput_mdape", "throughput_mape", "band_coverage", "failure_balanced_accuracy"):
        assert math.isfinite(first[key]), key
    assert first["n_test"] == pytest.approx(round(len(table) * 0.15))
    assert first["n_train"] + first["n_test"] == len(table)


def test_compiled_trees_equal_the_scikit_learn_estimators_on_the_real_sample(
    models: CalibratedModels, sample: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14, point 4: Treelite's predictions within 1e-6 relative of scikit-learn's own, for every
    number a prediction carries; also for configurations with categories no model saw (unknown GPU and
    model family, a protocol never run), which both must send where missing values go."""
    monkeypatch.setattr(compiled_trees, "COMPILED_BELOW_ROWS", len(sample) + 1)  # Treelite for every row here
    monkeypatch.setattr(tree_walker, "_walker", None)  # as on a machine without a C compiler: no walker
    monkeypatch.setattr(tree_walker, "_walker_tried", True)
    assert models.tree_engine() == "treelite"
    unseen = sample.head(40).assign(
        gpu_model="H200-SXM", model_name="qwen2-7b", experiment_id="SFTTrainer.never-seen-protocol"
    )
    for table in (sample, unseen):
        compiled = models.predict_frame(table, power=True)
        reference = models.predict_frame(table, power=True, reference=True)
        for column in ("p_valid", *BAND, "power_watts"):
            got, want = compiled[column].to_numpy(float), reference[column].to_numpy(float)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12, err_msg=column)


def test_the_band_is_narrower_where_the_model_has_seen_the_configuration(
    models: CalibratedModels, sample: pd.DataFrame, predicted: pd.DataFrame
) -> None:
    """Issue 14, point 1: the band adapts. A configuration the training rows hold many times gets a
    narrower band than the same configuration moved to a GPU type nobody ran that model on."""
    width = (predicted[BAND[2]] - predicted[BAND[0]]) / predicted[BAND[1]]
    valid = sample["outcome"] == "valid"
    assert width[valid].std() > 0.05 * width[valid].median()  # not one constant for everything
    seen = sample[valid].head(200)
    moved = seen.assign(model_name="llama3.1-405b")  # a size the benchmark never ran
    moved_band = models.predict_frame(moved)
    moved_width = (moved_band[BAND[2]] - moved_band[BAND[0]]) / moved_band[BAND[1]]
    assert moved_width.median() > 1.5 * width[seen.index].median()
    assert (predicted[BAND[0]] <= predicted[BAND[1]]).all() and (
        predicted[BAND[1]] <= predicted[BAND[2]]
    ).all()


def test_p_valid_low_is_a_lower_bound_never_above_the_point_estimate(
    models: CalibratedModels, predicted: pd.DataFrame, sample: pd.DataFrame
) -> None:
    low, point = predicted["p_valid_low"].to_numpy(), predicted["p_valid"].to_numpy()
    assert np.all(np.isfinite(low)) and np.all(low <= point + 1e-12) and np.all(low >= 0.0)
    passed = predicted["outcome"] != Outcome.REJECTED.value
    assert np.mean(low[passed] < point[passed]) > 0.5  # a bound, not a copy of the estimate
    knots_p, knots_low = models.failure.lower_bound  # type: ignore[misc]
    assert np.all(np.diff(knots_low) >= 0) and np.all(np.diff(knots_p) >= 0)
    # Among the sample's rows bounded at >= 0.9, at least 90 % ran (the bound holds on the data).
    ran = (sample["outcome"] == Outcome.VALID.value).to_numpy()
    sure = passed.to_numpy() & (low >= 0.9)
    assert sure.sum() > 100 and ran[sure].mean() >= 0.9


def test_the_lower_bound_is_calibrated_on_out_of_fold_predictions(
    models: CalibratedModels, sample: pd.DataFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fit_failure hands the bound each row's prediction by the one member that did not train on it."""
    from sklearn.model_selection import StratifiedKFold

    from calibrate import failure

    seen: list[tuple[np.ndarray, np.ndarray]] = []
    original = failure.fit_lower_bound

    def recording(predicted: np.ndarray, ran: np.ndarray, **kwargs: int) -> tuple[list[float], list[float]]:
        seen.append((predicted.copy(), ran.copy()))
        return original(predicted, ran, **kwargs)

    monkeypatch.setattr(failure, "fit_lower_bound", recording)
    passed = sample[sample["outcome"] != Outcome.REJECTED.value]
    X, _, _ = models.matrix(passed)
    ran = (passed["outcome"] == Outcome.VALID.value).to_numpy()
    pairs = failure.model_method(passed["model_name"].to_numpy(), passed["method"].to_numpy())
    fitted = failure.fit_failure(X, ran, None, seed=3, pairs=pairs)
    # Two bounds: the members' out-of-fold one, then the novel one on held-out blocks' novel rows.
    assert len(seen) == 2 and len(seen[1][0]) < len(ran)
    oof, oof_ran = seen[0]
    assert np.array_equal(oof_ran, ran) and np.all(np.isfinite(oof))
    members = fitted.member_predictions(X, reference=True)
    folds = StratifiedKFold(failure.MEMBERS, shuffle=True, random_state=3).split(np.zeros(len(ran)), ran)
    for k, (_train, held_out) in enumerate(folds):
        np.testing.assert_allclose(oof[held_out], members[k, held_out], rtol=1e-9)
    # Out of fold, the bound is below the share that ran in every bin of predictions.
    knots_p, knots_low = fitted.lower_bound  # type: ignore[misc]
    for lo, hi in zip(knots_p[1:-2], knots_p[2:-1], strict=True):
        inside = (oof >= lo) & (oof <= hi)
        if inside.sum() >= 50:
            assert np.interp(lo, knots_p, knots_low) <= ran[inside].mean() + 1e-9


def test_the_lower_bound_knots_are_monotone_and_below_each_bins_share() -> None:
    from calibrate.failure import fit_lower_bound

    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 4000)
    ran = rng.uniform(0, 1, 4000) < p
    knots_p, knots_low = fit_lower_bound(p, ran, bin_rows=400)
    assert knots_p[0] == 0.0 and knots_p[-1] == 1.0 and np.all(np.diff(knots_low) >= 0)
    middle = np.array(knots_p[1:-1])
    assert np.all(np.array(knots_low[1:-1]) <= middle + 0.02)  # a bound on a calibrated p: below it
    assert np.interp(0.9, knots_p, knots_low) > 0.75  # and not vacuous


def test_novel_llm_method_pairs_are_bounded_by_what_held_out_blocks_showed(
    models: CalibratedModels, sample: pd.DataFrame
) -> None:
    """An LLM and method the training rows lack get the bound measured on held-out blocks' rows of pairs
    their members never saw, which ran less often than the random folds' rows: a lower p_valid_low."""
    from calibrate.fit import CalibratedModels as Models

    knots_p, knots_low = models.failure.novel_lower_bound  # type: ignore[misc]
    first = sample[sample["outcome"] == Outcome.VALID.value].iloc[0]
    other = "full" if first["method"] != "full" else "lora"
    names = np.array([first["model_name"], "llama3.3-70b", first["model_name"]])
    novel = models.failure.novel(names, np.array([first["method"], first["method"], other])).tolist()
    assert novel[:2] == [False, True]  # a known pair; an LLM the sample does not have
    pairs = set(sample["model_name"] + "|" + sample["method"])
    assert novel[2] == (f"{first['model_name']}|{other}" not in pairs)  # the same LLM, another method
    assert np.all(np.diff(knots_p) >= 0) and np.all(np.diff(knots_low) >= 0)
    passed = sample[sample["outcome"] != Outcome.REJECTED.value]
    X, _, _ = models.matrix(passed)
    point, seen_low = models.failure.predict_with_low(X, np.zeros(len(X), dtype=bool))
    _, novel_low = models.failure.predict_with_low(X, np.ones(len(X), dtype=bool))
    assert np.all(novel_low <= seen_low + 1e-12) and np.all(novel_low <= point + 1e-12)
    sure = point > 0.97
    assert sure.sum() > 100 and np.median(seen_low[sure] - novel_low[sure]) > 0.05
    # predict_frame bounds a model the benchmark never ran by the novel bound; the registry's parts keep it.
    config = passed[passed["outcome"] == Outcome.VALID.value].head(50)
    moved = config.assign(model_name="llama3.3-70b")  # an LLM the sample does not have
    frame = models.predict_frame(moved)
    expected = models.failure.predict_with_low(models.matrix(moved)[0], np.ones(len(moved), dtype=bool))[1]
    np.testing.assert_allclose(frame["p_valid_low"].to_numpy(), np.where(
        frame["outcome"] == Outcome.REJECTED.value, 0.0, expected), rtol=1e-9)  # fmt: skip
    estimators, params = models.to_parts()
    again = Models.from_parts(estimators, params)
    assert again.failure.novel_lower_bound == models.failure.novel_lower_bound
    assert again.failure.known_pairs == models.failure.known_pairs and len(again.failure.known_pairs) > 10
