"""Native trees (calibrate/native_trees.py) and the tree walker (calibrate/tree_walker.py): the estimators
compiled to machine code, and walked from their arrays, give scikit-learn's numbers; libraries are compiled
once per machine and loaded from a private cache, and never stop a prediction when there is no compiler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import boosting, native_trees, performance, tree_walker
from calibrate.compiled import CompiledTrees
from calibrate.fit import CalibratedModels
from calibrate.loader import load_benchmark
from calibrate.registry import ModelRegistry
from calibrate.tree_walker import TreeArrays

BAND = ("tokens_per_second_p10", "tokens_per_second_p50", "tokens_per_second_p90")


@pytest.fixture(scope="module")
def sample(sample_csv: Path) -> pd.DataFrame:
    return load_benchmark(sample_csv)


def loaded(models_dir: Path) -> CalibratedModels:
    found = ModelRegistry(models_dir).load_in_use()
    assert found is not None
    return found[1]


def test_native_trees_equal_the_scikit_learn_estimators_on_the_real_sample(
    calibrated_models_dir: Path, sample: pd.DataFrame
) -> None:
    """Issue 14, point 4: within 1e-6 relative of scikit-learn for every number a prediction carries, in
    small batches (an answer: one thread) and large ones (a CSV: every core), unseen categories included;
    through the walker first, then through the trees' own libraries, which give the walker's numbers to
    the last bit."""
    models = loaded(calibrated_models_dir)
    unseen = sample.head(40).assign(
        gpu_model="H200-SXM", model_name="qwen2-7b", experiment_id="SFTTrainer.never-seen-protocol"
    )
    large = pd.concat([sample] * 6, ignore_index=True)  # over PARALLEL_FROM_ROWS: the threaded loop
    tables = (sample.head(70), unseen, large)
    walked = []
    for engine in ("walker", "native"):
        if engine == "native":
            assert models.prepare_native(wait=True)
        assert models.tree_engine() == engine
        for k, table in enumerate(tables):
            got = models.predict_frame(table, power=True)
            reference = models.predict_frame(table, power=True, reference=True)
            for column in ("p_valid", "p_valid_low", *BAND, "power_watts"):
                want = reference[column].to_numpy(float)
                np.testing.assert_allclose(got[column].to_numpy(float), want, rtol=1e-6, atol=1e-12)
            if engine == "walker":
                walked.append(got)
            else:
                pd.testing.assert_frame_equal(got, walked[k], check_exact=True)


def test_a_large_ensemble_compiles_in_units_and_sums_as_scikit_learn_does(
    calibrated_models_dir: Path, sample: pd.DataFrame, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The 1,000-tree throughput model is compiled in several units side by side (TREES_PER_UNIT each) and
    linked into one library, whose raw scores are scikit-learn's to the last bit: each row adds the
    baseline and the trees in their order, whichever unit holds them."""
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    models = loaded(calibrated_models_dir)
    regressor = models.throughput.regressor
    source = native_trees.tree_source(TreeArrays.from_estimator(regressor))
    assert source.count(native_trees.UNIT_MARK) == -(-regressor.n_iter_ // native_trees.TREES_PER_UNIT) > 1
    library = native_trees.load(source)
    assert library is not None
    X, _, _ = models.matrix(sample)
    want = regressor._raw_predict(boosting.trainable(X, performance.FEATURE_NAMES)).ravel()
    assert np.array_equal(library.raw(CompiledTrees(regressor)._in_tree_space(X)), want)


def test_a_second_process_loads_the_library_from_the_cache_without_compiling(
    calibrated_models_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    estimator = loaded(calibrated_models_dir).throughput.difficulty
    source = native_trees.tree_source(TreeArrays.from_estimator(estimator))
    first = native_trees.load(source)
    assert first is not None and first.path.parent == tmp_path / "cache" / "trees"
    assert oct(first.path.stat().st_mode & 0o777) == oct(0o700)
    compiles: list[object] = []
    monkeypatch.setattr(native_trees, "_compile", lambda *args: compiles.append(args))
    again = native_trees.load(source)
    assert compiles == []
    assert again is not None and again.path == first.path


def test_a_cache_others_can_write_to_is_not_loaded_from(
    calibrated_models_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    source = native_trees.tree_source(
        TreeArrays.from_estimator(loaded(calibrated_models_dir).throughput.difficulty)
    )
    cached = native_trees.load(source)
    assert cached is not None
    os.chmod(cached.path.parent, 0o777)  # anyone could have swapped the library
    elsewhere = native_trees.load(source)
    assert elsewhere is not None and elsewhere.path.parent != cached.path.parent
    os.chmod(cached.path.parent, 0o700)
    os.chmod(cached.path, 0o766)  # the file itself writable by others: compiled again in its place
    before = cached.path.stat().st_ino
    rebuilt = native_trees.load(source)
    assert rebuilt is not None and rebuilt.path == cached.path
    assert cached.path.stat().st_ino != before and cached.path.stat().st_mode & 0o777 == 0o700


def test_without_a_compiler_predictions_stay_on_treelite(
    calibrated_models_dir: Path, sample: pd.DataFrame, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No library of the trees' own and no walker (both need a compiler): Treelite, same numbers."""
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(tree_walker, "_walker", None)  # as in a process that never loaded one
    monkeypatch.setattr(tree_walker, "_walker_tried", False)
    models = loaded(calibrated_models_dir)
    assert not models.prepare_native(wait=True)
    assert models.tree_engine() == "treelite"
    got = models.predict_frame(sample.head(50))
    want = models.predict_frame(sample.head(50), reference=True)
    np.testing.assert_allclose(got[BAND[1]], want[BAND[1]], rtol=1e-6)


def test_a_compile_error_is_logged_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    assert native_trees.load("this is not C;") is None
    assert "compiling failed" in caplog.text
    assert not list((tmp_path / "cache" / "trees").glob("*.so"))  # nothing half-built is left to load


def test_native_trees_can_be_turned_off(calibrated_models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINETWIN_NATIVE_TREES", "off")
    models = loaded(calibrated_models_dir)
    assert not models.prepare_native(wait=True)
    assert models.tree_engine() == "treelite"


def test_a_damaged_library_in_the_cache_is_compiled_again(
    calibrated_models_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another process compiled it, then the file was damaged (a disk error, a half-copied cache): this
    process compiles it again in its place instead of failing or falling back. (Within one process the
    loader keeps the library it mapped, whatever happens to the file.)"""
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    estimator = loaded(calibrated_models_dir).throughput.difficulty
    source_file = tmp_path / "trees.c"
    source_file.write_text(native_trees.tree_source(TreeArrays.from_estimator(estimator)))
    code = "import sys; from calibrate import native_trees as n; print(n.load(open(sys.argv[1]).read()).path)"
    done = subprocess.run(
        [sys.executable, "-c", code, str(source_file)], capture_output=True, text=True, check=True
    )
    path = Path(done.stdout.strip())
    assert path.parent == tmp_path / "cache" / "trees"
    path.write_bytes(b"not a shared library")
    again = native_trees.load(source_file.read_text())
    assert again is not None and again.path == path and path.stat().st_size > 1000
    X = np.zeros((3, int(estimator.n_features_in_)))
    in_tree_space = CompiledTrees(estimator)._in_tree_space(X)  # what the library is handed
    np.testing.assert_allclose(again.raw(in_tree_space), estimator.predict(X), rtol=1e-9)


def test_one_unit_that_does_not_compile_fails_the_whole_library(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    good = "double tree_0(const double *x) { return x[0]; }\n"
    assert native_trees.load(native_trees.UNIT_MARK.join([good, "this is not C;", good])) is None
    assert "compiling failed" in caplog.text and "this is not C" in caplog.text
    assert not list((tmp_path / "cache" / "trees").rglob("*.so"))


def test_a_compile_stopped_by_another_units_failure_leaves_nothing_in_the_temporary_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A unit that fails stops the others mid-compile; a compiler stopped so does not remove its own
    temporary files, which went to the system's temporary directory (a `cc*.s` per stopped unit)."""
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(tmp_path / "cache"))
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    # Long enough to be compiling still when the bad unit has failed.
    slow = "".join(
        f"double tree_{k}(const double *x) {{ return x[0] * {k} + {k}; }}\n" for k in range(20_000)
    )
    assert native_trees.load(native_trees.UNIT_MARK.join(["this is not C;", slow])) is None
    assert list(system_tmp.iterdir()) == []
