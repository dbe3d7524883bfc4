"""Calibration and prediction speed: `finetwin calibrate` on 30,920 rows (the size of the full benchmark: the
bundled real sample resampled with replacement) against issue 14's 15 s budget, first into an empty registry
and then again on another resample (compared with the version in use: its kept comparison fit scored, or
refitted where it kept none), `finetwin predict` of a 100,000-row configurations CSV against its 2 s budget
(the command in a fresh process, imports and loading included; and in process), and predicting the 3,983
rows of the sample against a plain gradient-boosting model on names and sizes (the accuracy baseline).

    .venv/bin/python bench/calibrate_speed.py [--rows 30920] [--predict-rows 100000] [--repeat 3]
        [--baseline NAME=DIR ...]

`--baseline` measures another checkout (e.g. a `git archive` of main before a change) with the same script
in the same run: the script runs again in a subprocess with that checkout first on the import path.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# `--tree DIR` (what --baseline passes): import finetwin from DIR instead of this checkout.
_TREE = (
    sys.argv[sys.argv.index("--tree") + 1]
    if "--tree" in sys.argv
    else str(Path(__file__).resolve().parents[1])
)
sys.path.insert(0, _TREE)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402
from timing import best_of  # noqa: E402

from calibrate.loader import bundled_benchmark_path, load_benchmark  # noqa: E402
from calibrate.predict import predict_csv  # noqa: E402
from calibrate.refit import calibrate_version  # noqa: E402
from calibrate.registry import ModelRegistry  # noqa: E402

CALIBRATE_BUDGET_S = 15.0
PREDICT_BUDGET_S = 2.0


def resampled_csv(rows: int, path: Path, seed: int = 0) -> Path:
    raw = pd.read_csv(bundled_benchmark_path(), dtype=str, keep_default_na=False)
    picked = np.random.default_rng(seed).integers(0, len(raw), size=rows)
    raw.iloc[picked].to_csv(path, index=False)
    return path


def distinct_configs_csv(rows: int, path: Path, seed: int = 3) -> tuple[Path, int]:
    """Configurations no two alike (about `rows`; their count): resampled rows with random sequence lengths
    and batch sizes."""
    raw = pd.read_csv(bundled_benchmark_path(), dtype=str, keep_default_na=False)
    rng = np.random.default_rng(seed)
    table = raw.iloc[rng.integers(0, len(raw), size=rows)].copy()
    table["tokens_per_sample"] = rng.integers(128, 65_536, size=rows).astype(str)
    table["batch_size"] = rng.integers(1, 1_024, size=rows).astype(str)
    table = table.drop_duplicates(subset=["identifier", "tokens_per_sample", "batch_size"])
    table.to_csv(path, index=False)
    return path, len(table)


def run_predict_command(models: Path, configs: Path, output: Path) -> float:
    """Wall seconds of `finetwin predict` in a fresh process, with the checkout measured on its path."""
    command = [sys.executable, "-m", "finetwin.cli", "predict", "--models", str(models),
               "--input", str(configs), "--output", str(output), "--force"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": _TREE}
    started = time.perf_counter()
    # From the measured tree: `python -m` puts the working directory first on the path, before PYTHONPATH.
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=_TREE)
    return time.perf_counter() - started


def plain_baseline(table: pd.DataFrame) -> tuple[float, float]:
    """Fit and predict seconds of gradient boosting on names and sizes (the issue's baseline model)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    valid = table[table["outcome"] == "valid"]
    columns = [
        "model_name",
        "method",
        "gpu_model",
        "number_gpus",
        "number_nodes",
        "batch_size",
        "tokens_per_sample",
    ]

    def features(frame: pd.DataFrame) -> pd.DataFrame:
        out = frame[columns].copy()
        for name in ("model_name", "method", "gpu_model"):
            out[name] = out[name].astype("category")
        return out

    # One OpenMP thread, as finetwin's own fits use: on a shared machine more threads only spin.
    with threadpool_limits(limits=1, user_api="openmp"):
        started = time.perf_counter()
        model = HistGradientBoostingRegressor(categorical_features="from_dtype", random_state=0)
        model.fit(features(valid), np.log(valid["dataset_tokens_per_second"]))
        fitted = time.perf_counter()
        model.predict(features(table))
    return fitted - started, time.perf_counter() - fitted


def compile_as_the_api_does(models_dir: Path, models: Any) -> bool:
    """Compile the version in use's trees as the API's reader does; True when they are native."""
    from calibrate import registry

    reader_type = getattr(registry, "InUseModels", None)
    if reader_type is not None and hasattr(reader_type, "wait_native"):
        reader = reader_type(models_dir)
        loaded = reader.get()
        reader.wait_native()
        return loaded is not None and loaded[1].tree_engine() == "native"
    # A checkout before the reader left the snapshot: compile as it did.
    return bool(models.prepare_native(wait=True)) if hasattr(models, "prepare_native") else False


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(rows: int, predict_rows: int, repeat: int) -> list[tuple[str, float, float | None, str]]:
    """(figure, seconds, baseline or budget seconds, what the baseline is) for the code on the import path."""
    sample = bundled_benchmark_path()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        big = resampled_csv(rows, work / "resampled.csv")
        many = resampled_csv(predict_rows, work / "many.csv", seed=1)
        distinct, distinct_rows = distinct_configs_csv(predict_rows, work / "distinct.csv")
        # A cache of this run's own: what a calibration leaves there, and compiles, are timed.
        os.environ["FINETWIN_CACHE_DIR"] = str(work / "cache")
        started, cpu_started, worker_started = time.perf_counter(), time.process_time(), _children_cpu()
        result = calibrate_version(work / "models", benchmarks=[big], reason="bench")
        calibrate_s, calibrate_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        worker_cpu_s = _children_cpu() - worker_started
        # The first `finetwin predict` after the calibration, as a user meets it: the version's trees not
        # compiled for this machine yet (this checkout walks them from the snapshot the calibration left;
        # checkouts before it compiled them first, or loaded the version through skops).
        first_cli_s = run_predict_command(work / "models", many, work / "first_pred.csv")
        first_distinct_s = run_predict_command(work / "models", distinct, work / "first_distinct.csv")

        registry = ModelRegistry(work / "models")
        load_s = best_of(repeat, lambda: registry.load_in_use())
        _, models = registry.load_in_use()  # type: ignore[misc]
        # As the API does once it loads a version: the trees as machine code, compiled once per version and
        # machine (calibrate/native_trees.py), and the version's serving snapshot naming them
        # (calibrate/serving.py).
        started = time.perf_counter()
        native = compile_as_the_api_does(work / "models", models)
        compile_s = time.perf_counter() - started
        if native:  # this process's own copy of the version, from the libraries just compiled
            models.prepare_native(wait=True)
        reload = lambda: registry.load_in_use()[1].prepare_native(wait=True)  # noqa: E731
        cached_s = best_of(repeat, reload) if native else 0.0
        table = load_benchmark(sample)
        predict_s = best_of(repeat, lambda: models.predict_frame(table))
        cli_s = best_of(repeat, lambda: predict_csv(models, sample, work / "pred.csv"))
        started, cpu_started = time.perf_counter(), time.process_time()
        predict_csv(models, many, work / "many_pred.csv")
        many_s, many_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        # The command as a user runs it, in a fresh process: imports, loading the version, the CSV both ways,
        # from the serving snapshot the API left (naming the compiled trees).
        cli_many_s = min(
            run_predict_command(work / "models", many, work / "cli_pred.csv") for _ in range(repeat)
        )
        cli_distinct_s = run_predict_command(work / "models", distinct, work / "cli_distinct_pred.csv")
        # Without a snapshot (a registry calibrated on another machine), it loads the version from the
        # registry through scikit-learn and skops, and leaves one for later runs.
        for snapshot in (work / "cache").glob("**/serving-*"):
            snapshot.unlink()
        registry_cli_s = run_predict_command(work / "models", many, work / "cli_pred.csv")
        baseline_fit_s, baseline_predict_s = plain_baseline(table)
        # New rows against the version in use: the comparison fits the candidate's side and scores the version
        # in use's kept comparison fit ("same split, its kept fit"), or, where it kept none (code before it
        # was kept), fits that side again too ("same split").
        again = resampled_csv(rows, work / "resampled-again.csv", seed=2)
        started = time.perf_counter()
        second = calibrate_version(work / "models", benchmarks=[again], reason="bench")
        recalibrate_s = time.perf_counter() - started
        assert second.comparison is not None, second.message
        assert second.comparison.basis in ("same split", "same split, its kept fit"), second.message

    return [
        (f"finetwin calibrate, {rows:,} rows (2 fits + save)", calibrate_s, CALIBRATE_BUDGET_S, "budget"),
        ("  CPU s: final fit, loading, saving (this process)", calibrate_cpu_s, CALIBRATE_BUDGET_S, "budget"),
        ("  CPU s: held-out comparison (its worker process)", worker_cpu_s, None, ""),
        ("  of which the final fit (wall)", result.final_fit_seconds, CALIBRATE_BUDGET_S, "budget"),
        (f"  again, {rows:,} other rows, against the version in use", recalibrate_s,
         CALIBRATE_BUDGET_S, "budget"),
        (f"first `finetwin predict` after it, {predict_rows:,} rows", first_cli_s, PREDICT_BUDGET_S,
         "budget"),
        (f"  {distinct_rows:,} rows, no configuration repeated", first_distinct_s, PREDICT_BUDGET_S,
         "budget"),
        (f"`finetwin predict` command, {predict_rows:,} rows", cli_many_s, PREDICT_BUDGET_S, "budget"),
        ("  loading the version through skops (no snapshot)", registry_cli_s, PREDICT_BUDGET_S, "budget"),
        (f"  {distinct_rows:,} rows, no configuration repeated", cli_distinct_s, PREDICT_BUDGET_S,
         "budget"),
        (f"predict_csv in process, {predict_rows:,} rows", many_s, PREDICT_BUDGET_S, "budget"),
        ("  CPU s of it", many_cpu_s, PREDICT_BUDGET_S, "budget"),
        (f"predict_frame, {len(table):,} rows", predict_s, baseline_predict_s, "plain GBM predict"),
        (f"predict CSV -> CSV, {len(table):,} rows", cli_s, baseline_predict_s, "plain GBM predict"),
        ("load the version in use (verify + skops)", load_s, None, ""),
        ("compile its trees + snapshot, as the API does, once", compile_s, None, ""),
        ("  later: load them from the cache (+ the version)", cached_s, None, ""),
        (f"plain GBM fit, {len(table):,} rows", baseline_fit_s, None, ""),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=30_920)
    parser.add_argument("--predict-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="prediction timings: best of this many")
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = measure(args.rows, args.predict_rows, args.repeat)
    if args.json:
        print(json.dumps(rows))
        return
    tables = {"this checkout": rows}
    for name, tree in (b.split("=", 1) for b in args.baseline):
        sizes = [
            "--rows",
            str(args.rows),
            "--predict-rows",
            str(args.predict_rows),
            "--repeat",
            str(args.repeat),
        ]
        command = [sys.executable, __file__, "--tree", str(Path(tree).resolve()), "--json", *sizes]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        tables[name] = [tuple(row) for row in json.loads(output.strip().splitlines()[-1])]
    print(f"{'figure':<52} {'checkout':>22} {'seconds':>9} {'baseline':>9} {'ratio':>7}  baseline is")
    for k, (figure, *_rest) in enumerate(rows):
        for name, table in tables.items():
            _, seconds, baseline, what = table[k]
            ratio = f"{seconds / baseline:>7.2f}" if baseline else f"{'':>7}"
            base = f"{baseline:>9.3f}" if baseline else f"{'':>9}"
            print(f"{figure:<52} {name:>22} {seconds:>9.3f} {base} {ratio}  {what}")
    load = os.getloadavg()[0]
    print(f"\nload average at the end: {load:.1f} on {os.cpu_count()} cores (wall times stretch when high;")
    print("on an idle machine a wall time is about the larger of the two CPU times of the calibration)")


if __name__ == "__main__":
    main()
