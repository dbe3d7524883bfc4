"""A version loaded from its serving snapshot (calibrate/serving.py): `finetwin calibrate` leaves one, and
`finetwin predict` loads the version from it without scikit-learn or skops, with the same numbers, through
the tree walker or, once they are compiled on this machine, the trees' own libraries; and any doubt about
the snapshot (a cache others can write to, an unreadable file, damaged arrays, a tampered version) means the
registry's own loading, never a wrong model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calibrate import serving, tree_walker
from calibrate.fit import CalibratedModels
from calibrate.loader import load_benchmark
from calibrate.registry import InUseModels, ModelRegistry, RegistryError

NUMBERS = (
    "p_valid",
    "p_valid_low",
    "tokens_per_second_p10",
    "tokens_per_second_p50",
    "tokens_per_second_p90",
)


@pytest.fixture(scope="module")
def compiled_cache(calibrated_models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache directory holding the version's compiled trees and its snapshot (made as predict makes it)."""
    cache = tmp_path_factory.mktemp("serving") / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETWIN_CACHE_DIR", str(cache))
        registry = ModelRegistry(calibrated_models_dir)
        version, models = registry.load_in_use()  # type: ignore[misc]
        assert models.prepare_native(wait=True)
        assert serving.save(registry, version, models) is not None
        yield cache


@pytest.fixture
def cache_copy(compiled_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the compiled cache, in use by this test, free to damage."""
    copy = Path(shutil.copytree(compiled_cache, tmp_path / "cache"))
    monkeypatch.setenv("FINETWIN_CACHE_DIR", str(copy))
    return copy


def test_the_snapshot_gives_the_numbers_of_the_registry_version_without_scikit_learn(
    calibrated_models_dir: Path, compiled_cache: Path, sample_csv: Path, tmp_path: Path
) -> None:
    """In a fresh process, as `finetwin predict` runs: neither scikit-learn nor skops is imported, and every
    number equals what the version loaded from the registry (its trees compiled) predicts."""
    code = (
        "import json, sys\n"
        "from calibrate import serving\n"
        "from calibrate.loader import load_benchmark\n"
        "from calibrate.registry import ModelRegistry\n"
        "version, models = serving.load_in_use(ModelRegistry(sys.argv[1]))\n"
        "models.predict_frame(load_benchmark(sys.argv[2]), power=True).to_csv(sys.argv[3], index=False)\n"
        "heavy = ('sklearn', 'skops', 'treelite', 'scipy')\n"
        "imported = sorted(m for m in heavy if m in sys.modules)\n"
        "print(json.dumps({'version': version, 'engine': models.tree_engine(), 'imported': imported}))\n"
    )
    out = tmp_path / "snapshot.csv"
    done = subprocess.run(
        [sys.executable, "-c", code, str(calibrated_models_dir), str(sample_csv), str(out)],
        capture_output=True, text=True, env={**os.environ, "FINETWIN_CACHE_DIR": str(compiled_cache)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {"version": "v0001", "engine": "native", "imported": []}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETWIN_CACHE_DIR", str(compiled_cache))
        _, models = ModelRegistry(calibrated_models_dir).load_in_use()  # type: ignore[misc]
        assert models.prepare_native(wait=True)
        want = models.predict_frame(load_benchmark(sample_csv), power=True)
    got = pd.read_csv(out, keep_default_na=False, na_values=[""])
    assert list(got["outcome"]) == list(want["outcome"])
    for column in (*NUMBERS, "power_watts"):
        # The CSV round trip of a float64 is exact (repr), so the numbers must be equal, not close.
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=0, abs=0, nan_ok=True), column


def test_a_version_from_its_snapshot_runs_without_scikit_learn(
    calibrated_models_dir: Path, cache_copy: Path
) -> None:
    """Its trees have no estimator behind them: asked for scikit-learn's numbers, they say so."""
    registry = ModelRegistry(calibrated_models_dir)
    loaded = serving.load_in_use(registry)
    assert loaded is not None and loaded[0] == "v0001"
    assert isinstance(loaded[1], CalibratedModels) and loaded[1].tree_engine() == "native"
    with pytest.raises(RuntimeError, match="serving snapshot alone"):
        loaded[1].throughput.compiled_trees()[0].reference_predict(np.zeros((1, 44)))


def test_a_library_gone_leaves_the_walker_with_the_same_numbers(
    calibrated_models_dir: Path, cache_copy: Path, sample_csv: Path
) -> None:
    """The snapshot names libraries the cache no longer holds: the trees run through the walker, and every
    number is what the libraries gave."""
    registry = ModelRegistry(calibrated_models_dir)
    table = load_benchmark(sample_csv)
    native = serving.load_in_use(registry)
    assert native is not None and native[1].tree_engine() == "native"
    want = native[1].predict_frame(table, power=True)
    for library in (cache_copy / "trees").glob("*.so"):
        if library.name != tree_walker.walker().path.name:  # type: ignore[union-attr]
            library.unlink()
    walked = serving.load_in_use(registry)
    assert walked is not None and walked[1].tree_engine() == "walker"
    got = walked[1].predict_frame(table, power=True)
    assert list(got["outcome"]) == list(want["outcome"])
    for column in (*NUMBERS, "power_watts"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=0, abs=0, nan_ok=True), column


def test_no_snapshot_without_libraries_or_a_walker(
    calibrated_models_dir: Path, cache_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No library and no compiler for the walker: nothing runs the snapshot, so the registry loads it."""
    for library in (cache_copy / "trees").glob("*.so"):
        library.unlink()
    monkeypatch.setattr(tree_walker, "_walker", None)
    monkeypatch.setattr(tree_walker, "_walker_tried", False)
    monkeypatch.setenv("CC", "no-such-compiler")
    assert serving.load_in_use(ModelRegistry(calibrated_models_dir)) is None


def test_no_snapshot_from_a_cache_others_can_write_to(calibrated_models_dir: Path, cache_copy: Path) -> None:
    os.chmod(cache_copy / "trees", 0o777)
    assert serving.load_in_use(ModelRegistry(calibrated_models_dir)) is None


@pytest.mark.parametrize("damage", ["not json", '{"trees": {}, "platt": []}', '{"trees": 3}'])
def test_an_unusable_snapshot_is_no_snapshot(
    calibrated_models_dir: Path, cache_copy: Path, damage: str
) -> None:
    (snapshot,) = (cache_copy / "trees").glob("serving-*.json")
    snapshot.write_text(damage)
    assert serving.load_in_use(ModelRegistry(calibrated_models_dir)) is None


@pytest.mark.parametrize("damage", ["truncated", "a child before its parent", "a feature past the row"])
def test_damaged_arrays_are_no_snapshot(calibrated_models_dir: Path, cache_copy: Path, damage: str) -> None:
    """A walk must end inside the arrays whatever the file holds: arrays it could leave (or loop in) are
    refused before any row is walked, and the registry loads the version."""
    (arrays_file,) = (cache_copy / "trees").glob("serving-*.npz")
    if damage == "truncated":
        arrays_file.write_bytes(arrays_file.read_bytes()[:1000])
    else:
        with np.load(arrays_file, allow_pickle=False) as stored:
            arrays = dict(stored)
        nodes = arrays["throughput.nodes"]
        split = int(np.flatnonzero(nodes["kind"] != 0)[5])
        if damage == "a child before its parent":
            nodes["right"][split] = 0  # back to the root: a walk that never ends
        else:
            nodes["feature"][split] = 44
        with arrays_file.open("wb") as out:
            np.savez(out, **arrays)
    assert serving.load_in_use(ModelRegistry(calibrated_models_dir)) is None


def test_a_tampered_version_is_refused_even_with_a_snapshot(registry_copy: Path, cache_copy: Path) -> None:
    registry = ModelRegistry(registry_copy)
    assert serving.load_in_use(registry) is not None  # the copy has the same manifest: the same snapshot
    (artifact,) = [
        p for p in (registry_copy / "versions" / "v0001" / "estimators").iterdir() if "power" in p.name
    ]
    artifact.write_bytes(artifact.read_bytes() + b"\0")
    with pytest.raises(RegistryError, match="does not match its sha256"):
        serving.load_in_use(registry)


def test_a_snapshot_is_not_used_when_native_trees_are_off(
    calibrated_models_dir: Path, cache_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FINETWIN_NATIVE_TREES", "off")
    assert serving.load_in_use(ModelRegistry(calibrated_models_dir)) is None


def test_a_long_lived_reader_leaves_the_snapshot_for_the_next_predict(
    calibrated_models_dir: Path, cache_copy: Path
) -> None:
    """The API's reader of the version in use (its trees in the cache already, no snapshot yet): once it
    has compiled them, the snapshot is there for the next `finetwin predict`."""
    for snapshot in (cache_copy / "trees").glob("serving-*.json"):
        snapshot.unlink()
    assert serving.load_in_use(ModelRegistry(calibrated_models_dir)) is None
    reader = InUseModels(calibrated_models_dir)
    assert reader.get() is not None
    assert reader.wait_native(timeout=120)
    loaded = serving.load_in_use(ModelRegistry(calibrated_models_dir))
    assert loaded is not None and loaded[0] == "v0001" and loaded[1].tree_engine() == "native"


def test_calibrate_leaves_a_snapshot_the_next_predict_walks(sample_csv: Path, tmp_path: Path) -> None:
    """`calibrate_version` in a fresh cache: the version it writes loads from its snapshot at once (no
    library compiled yet: the walker), with the numbers of the version loaded from the registry."""
    from calibrate.refit import calibrate_version

    fresh = tmp_path / "fresh-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETWIN_CACHE_DIR", str(fresh))
        result = calibrate_version(tmp_path / "models", benchmarks=[sample_csv], reason="test")
        registry = ModelRegistry(tmp_path / "models")
        assert result.promoted and result.version is not None
        loaded = serving.load_in_use(registry)
        assert loaded is not None and loaded[0] == result.version
        assert loaded[1].tree_engine() == "walker"
        walker = tree_walker.walker()
        assert walker is not None
        assert {p.name for p in (fresh / "trees").glob("*.so")} <= {walker.path.name}  # no trees compiled
        table = load_benchmark(sample_csv)
        got = loaded[1].predict_frame(table, power=True)
        reference = registry.load(result.version)
        want = reference.predict_frame(table, power=True, reference=True)
    assert list(got["outcome"]) == list(want["outcome"])
    for column in (*NUMBERS, "power_watts"):
        assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=1e-6, nan_ok=True), column


def test_the_api_reader_starts_from_the_snapshot_and_compiles_in_the_background(
    calibrated_models_dir: Path, tmp_path: Path
) -> None:
    """The API's reader of the version in use, in a fresh process, with the snapshot a calibration leaves
    (no library compiled): it loads without importing scikit-learn or skops and answers through the walker;
    in the background it compiles the trees from the snapshot's arrays and names them in the snapshot, which
    the next process loads as native trees."""
    cache = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FINETWIN_CACHE_DIR", str(cache))
        registry = ModelRegistry(calibrated_models_dir)
        version, models = registry.load_in_use()  # type: ignore[misc]
        assert serving.save(registry, version, models) is not None  # as `calibrate_version` leaves it
    code = (
        "import json, sys\n"
        "from calibrate.registry import InUseModels\n"
        "reader = InUseModels(sys.argv[1])\n"
        "version, models = reader.get()\n"
        "first = models.tree_engine()\n"
        "imported = sorted(m for m in ('sklearn', 'skops', 'treelite') if m in sys.modules)\n"
        "done = reader.wait_native(timeout=300)\n"
        "print(json.dumps({'version': version, 'first': first, 'imported': imported, 'done': done,\n"
        "                  'after': models.tree_engine()}))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code, str(calibrated_models_dir)],
        capture_output=True, text=True, env={**os.environ, "FINETWIN_CACHE_DIR": str(cache)},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["version"] == "v0001" and report["imported"] == []
    assert report["first"] in ("compiling", "walker") and report["done"] and report["after"] == "native"
    described = json.loads(next((cache / "trees").glob("serving-*.json")).read_text())
    assert all(tree["library"] for tree in described["trees"].values())


def test_commands_load_the_version_in_use_from_its_snapshot(
    calibrated_models_dir: Path, compiled_cache: Path, sample_csv: Path, tmp_path: Path
) -> None:
    """`finetwin advise` and the twin's commands (`finetwin.wiring.load_job_models`) load the version in
    use from its snapshot: no scikit-learn or skops at their start, and an advice printed as from the
    registry's version."""
    config = tmp_path / "job.yaml"
    config.write_text(
        "model_name: llama3-8b\nmethod: lora\ngpu_model: A100-SXM\nnumber_gpus: 2\nnumber_nodes: 1\n"
        "batch_size: 8\ntokens_per_sample: 1024\n"
    )
    code = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from finetwin.settings import Settings\n"
        "from finetwin.wiring import load_job_models\n"
        "models = load_job_models(Settings(), Path(sys.argv[1]))\n"
        "heavy = ('sklearn', 'skops', 'treelite')\n"
        "print(json.dumps({'engine': models.tree_engine(),\n"
        "                  'imported': sorted(m for m in heavy if m in sys.modules)}))\n"
    )
    environment = {**os.environ, "FINETWIN_CACHE_DIR": str(compiled_cache)}
    ran = subprocess.run(
        [sys.executable, "-c", code, str(calibrated_models_dir)], capture_output=True, text=True,
        env=environment,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == {"engine": "native", "imported": []}
    advise = [sys.executable, "-m", "finetwin.cli", "advise", str(config)]
    answers = []
    for native in ("on", "off"):  # off: no snapshot, the registry's version through scikit-learn
        answer = subprocess.run(
            advise, capture_output=True, text=True,
            env={**environment, "FINETWIN_MODELS_DIR": str(calibrated_models_dir),
                 "FINETWIN_NATIVE_TREES": native},
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        answers.append(answer.stdout)
    assert "models: v0001" in answers[0] and answers[0] == answers[1]


def test_info_says_how_the_trees_of_the_version_in_use_run(
    calibrated_models_dir: Path,
    cache_copy: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`finetwin info`'s `trees` line, read off the cache without loading the version: compiled, walked
    from the snapshot, no snapshot yet, no compiler, turned off."""
    from finetwin.cli import main

    registry = ModelRegistry(calibrated_models_dir)
    assert serving.engine_of_in_use(registry) == "native: compiled for this machine"
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(calibrated_models_dir))
    assert main(["info"]) == 0
    assert "  trees           native: compiled for this machine\n" in capsys.readouterr().out
    walker = tree_walker.walker()
    assert walker is not None
    [p for p in (cache_copy / "trees").glob("*.so") if p.name != walker.path.name][0].unlink()
    assert (serving.engine_of_in_use(registry) or "").startswith("walker: `finetwin api`")
    for snapshot in (cache_copy / "trees").glob("serving-*"):
        snapshot.unlink()
    assert (serving.engine_of_in_use(registry) or "").startswith("walker, after loading through skops")
    monkeypatch.setenv("CC", "no-such-compiler")
    assert serving.engine_of_in_use(registry) == "treelite (no C compiler: install gcc, or name one in CC)"
    monkeypatch.setenv("FINETWIN_NATIVE_TREES", "off")
    assert serving.engine_of_in_use(registry) == "treelite (FINETWIN_NATIVE_TREES is off)"
    assert serving.engine_of_in_use(ModelRegistry(cache_copy / "no-registry")) is None


def test_a_reader_without_native_trees_leaves_no_snapshot(
    calibrated_models_dir: Path, cache_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for snapshot in (cache_copy / "trees").glob("serving-*.json"):
        snapshot.unlink()
    monkeypatch.setenv("FINETWIN_NATIVE_TREES", "off")
    reader = InUseModels(calibrated_models_dir)
    assert reader.get() is not None and reader.wait_native(timeout=120)
    assert list((cache_copy / "trees").glob("serving-*.json")) == []
