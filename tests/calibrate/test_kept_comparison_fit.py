"""A version keeps its comparison fit, and a later comparison scores it instead of fitting the version in use
again: on a split chosen by each row's fingerprint, so the kept fit never trained on the new held-out rows."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import calibrate.fit
import calibrate.refit
from calibrate.dataset import TrainingData, WeightPolicy, assemble, load_benchmarks
from calibrate.fit import fit_models
from calibrate.promotion import KEPT_FIT, SAME_ROWS, Incumbent, KeptFit, _incumbent_basis, split_of
from calibrate.refit import _refits_version_in_use, calibrate_version
from calibrate.registry import ModelRegistry
from calibrate.splits import hashed_holdout


def test_a_row_is_held_out_in_every_table_that_holds_it() -> None:
    rng = np.random.default_rng(7)
    hashes = [f"{value:016x}" for value in rng.integers(0, 2**63, size=4000)]
    first = hashed_holdout(hashes, seed=0)
    held_out = {hashes[i] for i in first.test}
    assert abs(len(first.test) / len(hashes) - 0.15) < 3 * np.sqrt(0.15 * 0.85 / len(hashes))
    # Another table: some of the same rows in another order, repeats, and rows the first never had.
    other = [*rng.permutation(hashes[:2500]), *hashes[:300], *(f"new-{k}" for k in range(500))]
    split = hashed_holdout(other, seed=0)
    assert sorted([*split.train, *split.test]) == list(range(len(other)))
    for position in split.test:
        assert other[position] in held_out or other[position].startswith("new-")
    for position in split.train:
        assert other[position] not in held_out
    assert set(hashed_holdout(hashes, seed=1).test) != set(first.test)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, sample_csv: Path) -> tuple[Path, Path]:
    """Two benchmark files that share some rows: the version in use learns from the first."""
    folder = tmp_path_factory.mktemp("kept")
    lines = sample_csv.read_text().splitlines(keepends=True)
    first, second = folder / "first.csv", folder / "second.csv"
    first.write_text("".join(lines[:500]))
    second.write_text("".join(lines[:1]) + "".join(lines[200:700]))
    return first, second


@pytest.fixture(scope="module")
def in_use(tmp_path_factory: pytest.TempPathFactory, files: tuple[Path, Path]) -> Path:
    models = tmp_path_factory.mktemp("in-use") / "models"
    calibrate_version(models, benchmarks=[files[0]], parallel=False)
    return models


@pytest.fixture
def fits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of each fit a calibration makes in this process."""
    made: list[int] = []
    real = calibrate.fit.fit_models

    def counted(table: pd.DataFrame, *args: object, **kwargs: object) -> object:
        made.append(len(table))
        return real(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(calibrate.fit, "fit_models", counted)
    return made


def test_the_kept_fit_is_the_fit_on_the_versions_own_rows_of_the_split(
    in_use: Path, files: tuple[Path, Path], sample_csv: Path
) -> None:
    registry = ModelRegistry(in_use)
    assert registry.has_comparison_fit("v0001")
    manifest = json.loads((registry.path("v0001") / "MANIFEST.json").read_text())["files"]
    assert "comparison/params.json" in manifest
    assert any(name.startswith("comparison/estimators/") for name in manifest)
    assert registry.metadata("v0001")["comparison"]["split"] == split_of(0)

    tables, described = load_benchmarks([files[0]])
    data = assemble(tables, None, now=datetime.now(UTC), policy=WeightPolicy(), described=described)
    train = np.ones(len(data), dtype=bool)
    train[hashed_holdout(data.row_hashes, seed=0).test] = False
    refitted = fit_models(data.table[train].reset_index(drop=True), seed=0, power=False)
    questions = load_benchmarks([sample_csv])[0][0].iloc[::7]
    kept = registry.load_comparison_fit("v0001").predict_frame(questions)
    pd.testing.assert_frame_equal(kept, refitted.predict_frame(questions))
    assert registry.metadata("v0001")["comparison"]["candidate"]["n_train"] == int(train.sum())


def test_a_later_comparison_scores_the_kept_fit_and_fits_twice_not_three_times(
    in_use: Path, files: tuple[Path, Path], tmp_path: Path, fits: list[int]
) -> None:
    models = Path(shutil.copytree(in_use, tmp_path / "models"))
    result = calibrate_version(models, benchmarks=[files[1]], parallel=False)
    assert result.comparison is not None and result.comparison.basis == KEPT_FIT
    assert len(fits) == 2, fits  # the candidate's comparison fit and the final fit
    kept_rows = ModelRegistry(models).metadata("v0001")["comparison"]["candidate"]["n_train"]
    assert result.comparison.incumbent is not None and result.comparison.incumbent["n_train"] == kept_rows
    # The new version keeps its own, for the comparison after it.
    assert ModelRegistry(models).has_comparison_fit(str(result.version))


def test_a_fit_kept_with_other_libraries_is_fitted_again(
    in_use: Path, files: tuple[Path, Path], tmp_path: Path, fits: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another finetwin (or scikit-learn) made that fit: this code fits the version in use's rows again."""
    versions = {**calibrate.refit.library_versions(), "finetwin": "a later release"}
    monkeypatch.setattr(calibrate.refit, "library_versions", lambda: versions)
    models = Path(shutil.copytree(in_use, tmp_path / "models"))
    result = calibrate_version(models, benchmarks=[files[1]], parallel=False)
    assert result.comparison is not None and result.comparison.basis == "same split"
    assert len(fits) == 3, fits


def test_a_damaged_kept_fit_leaves_the_version_in_use_and_says_why(
    in_use: Path, files: tuple[Path, Path], tmp_path: Path
) -> None:
    models = Path(shutil.copytree(in_use, tmp_path / "models"))
    params = ModelRegistry(models).path("v0001") / "comparison" / "params.json"
    params.write_text(params.read_text() + " ")  # one byte more: no longer what its manifest says
    result = calibrate_version(models, benchmarks=[files[1]], parallel=False)
    assert not result.promoted and ModelRegistry(models).in_use() == "v0001"
    assert result.comparison is not None
    assert any("cannot be measured" in reason for reason in result.comparison.reasons)


def test_the_version_in_use_is_measured_on_the_best_basis_its_rows_allow() -> None:
    """A kept fit wins unless the candidate has exactly the in-use version's rows (then its own fit is the
    same, and made already); without one, rows that cannot be rebuilt leave only the recorded metrics."""
    hashes = np.array([f"row-{k}" for k in range(100)])
    union = TrainingData(pd.DataFrame({"x": range(100)}), np.ones(100), hashes)
    every = np.ones(100, dtype=bool)
    test = np.zeros(100, dtype=bool)
    kept = KeptFit(Path("models"), "v0001", None, 85)

    def basis(rows: range, kept_fit: KeptFit | None, candidate: np.ndarray = every) -> str:
        incumbent = Incumbent("v0001", frozenset(f"row-{k}" for k in rows), {}, kept_fit)
        return _incumbent_basis(union, candidate, incumbent, test)[0]

    assert basis(range(100), kept) == SAME_ROWS
    assert basis(range(100), None) == SAME_ROWS
    assert basis(range(50), kept, np.arange(100) < 40) == KEPT_FIT  # its rows differ from the candidate's
    assert basis(range(50), None, np.arange(100) < 40) == "same split"
    assert basis(range(200), kept) == KEPT_FIT  # half its rows are gone: its kept fit had them all
    assert basis(range(200), None).startswith("recorded (only 50% of its rows")


def test_a_second_worker_is_started_early_only_to_fit_the_version_in_use_again(
    in_use: Path, tmp_path: Path
) -> None:
    """Its imports overlap the loading; a kept fit is scored in the calibrating process and needs none."""
    assert not _refits_version_in_use(ModelRegistry(in_use), seed=0)
    assert _refits_version_in_use(ModelRegistry(in_use), seed=1)  # its kept fit is of another split
    assert not _refits_version_in_use(ModelRegistry(tmp_path / "empty"), seed=0)  # nothing in use
