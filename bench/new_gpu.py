"""A GPU type the models never saw, as the catalogue describes it: is a data sheet worth having?

A provider's cluster has GPU types the benchmark never ran (an H100-SXM, an L4, an A100 of 40 GB). Before
they were in the catalogue (`twin.domain.GPU_TYPES`), such a type was an unknown GPU, taken as an
A100-PCIe: 80 GB of memory, 400 W, the A100-PCIe's speed. Now each has its data sheet's memory, power and
compute, and a speed scaled from a measured type of its architecture (`twin.domain.data_sheet_speed`).

This bench holds out each GPU type of the benchmark in turn, fits the models on the others (as
`bench/accuracy.py`'s gpu-out split), and predicts the held-out rows three ways with the same models:
- measured: the catalogue's entry with the speed the paper measured (what `bench/accuracy.py` reports);
- data sheet: the same entry with its speed from `data_sheet_speed` instead, from the A100-PCIe (from the
  A100-SXM when the A100-PCIe is the one held out): what a type the benchmark never ran gets;
- unknown: the type's name replaced by one the catalogue lacks: what every such type got before.

    .venv/bin/python bench/new_gpu.py [--bench FILE]

Ratio: data sheet / unknown, oriented so that below 1 is better (balanced accuracy as its shortfall,
coverage as its distance from 0.8). One run, pooled over the four folds, then per held-out type. Read the
types one by one: 88 % of the pooled rows are the A100-SXM's, for which "unknown" (an A100-PCIe) is its own
chip, and which, held out, leaves no NVLink, multi-node or more-than-4-GPU run to learn from.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from calibrate import accuracy  # noqa: E402
from calibrate.fit import fit_models  # noqa: E402
from calibrate.loader import bundled_benchmark_path, load_benchmark  # noqa: E402
from calibrate.splits import GPU_OUT, leave_one_group_out  # noqa: E402
from twin.domain import GPU_TYPES, data_sheet_speed  # noqa: E402

VARIANTS = ("measured", "data sheet", "unknown")
UNKNOWN_NAME = "NVIDIA-X100-SXM9"  # a name no catalogue entry answers to
NOMINAL_COVERAGE = 0.8


@contextmanager
def speed_from_data_sheet(gpu: str) -> Iterator[None]:
    """The catalogue's entry for `gpu` with its speed as a type the benchmark never ran would get it."""
    measured = GPU_TYPES[gpu]
    like = GPU_TYPES["NVIDIA-A100-80GB-PCIe" if gpu != "NVIDIA-A100-80GB-PCIe" else "NVIDIA-A100-SXM4-80GB"]
    GPU_TYPES[gpu] = replace(
        measured, relative_speed=data_sheet_speed(like, measured.dense_tflops, measured.memory_tbs)
    )
    try:
        yield
    finally:
        GPU_TYPES[gpu] = measured


def predictions(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """variant -> the held-out rows' predictions, every fold's, with the held-out type in `held_out`."""
    out: dict[str, list[pd.DataFrame]] = {v: [] for v in VARIANTS}
    for split in leave_one_group_out(table, "gpu_model", GPU_OUT):
        train, test = table.iloc[split.train], table.iloc[split.test]
        gpu = str(test["gpu_model"].iloc[0])
        models = fit_models(train, seed=0)
        with speed_from_data_sheet(gpu):
            sheet = models.predict_frame(test, power=True)
        renamed = test.assign(gpu_model=UNKNOWN_NAME)
        for variant, frame in (
            ("measured", models.predict_frame(test, power=True)),
            ("data sheet", sheet),
            ("unknown", models.predict_frame(renamed, power=True).set_index(test.index)),
        ):
            out[variant].append(frame.assign(held_out=gpu))
    return {v: pd.concat(frames) for v, frames in out.items()}


def metrics(table: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, float]:
    truth = table.loc[predicted.index]
    outcome = truth["outcome"].to_numpy()
    valid, passed = outcome == "valid", outcome != "rejected"
    actual = truth["dataset_tokens_per_second"].to_numpy()[valid]
    p50 = predicted["tokens_per_second_p50"].to_numpy()[valid]
    p_valid = predicted["p_valid"].to_numpy()[passed]
    watts = truth["gpu_power_watts_avg"].to_numpy(dtype=float)
    has_power = valid & np.isfinite(watts) & (watts > 0)
    return {
        "throughput MdAPE": accuracy.mdape(actual, p50),
        "throughput MAPE": accuracy.mape(actual, p50),
        "band coverage": accuracy.band_coverage(
            actual,
            predicted["tokens_per_second_p10"].to_numpy()[valid],
            predicted["tokens_per_second_p90"].to_numpy()[valid],
        ),
        "failure balanced accuracy": accuracy.balanced_accuracy(valid[passed], p_valid >= 0.5),
        "failure Brier score": accuracy.brier_score(valid[passed], p_valid),
        "power MdAPE": accuracy.mdape(watts[has_power], predicted["power_watts"].to_numpy()[has_power])
        if has_power.any()
        else float("nan"),
    }


def oriented(metric: str, value: float) -> float:
    """Lower is better: balanced accuracy as its shortfall, coverage as its distance from nominal."""
    if metric == "failure balanced accuracy":
        return 1.0 - value
    if metric == "band coverage":
        return abs(value - NOMINAL_COVERAGE)
    return value


def print_rows(title: str, rows: dict[str, dict[str, float]]) -> None:
    header = f"{'metric':<27} {'measured':>9} {'data sheet':>10} {'unknown':>9} {'ratio':>7}"
    print(f"\n{title}\n{header}\n{'-' * len(header)}")
    for metric in rows["measured"]:
        values = [rows[v][metric] for v in VARIANTS]
        if all(np.isnan(values)):
            continue
        baseline = oriented(metric, values[2])
        ratio = oriented(metric, values[1]) / baseline if baseline else float("nan")
        cells = " ".join(f"{v:>{w}.4f}" for v, w in zip(values, (9, 10, 9), strict=True))
        print(f"{metric:<27} {cells} {ratio:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, default=bundled_benchmark_path())
    args = parser.parse_args()
    table = load_benchmark(args.bench)
    started = time.perf_counter()
    with threadpool_limits(limits=1, user_api="openmp"):
        predicted = predictions(table)
    elapsed = time.perf_counter() - started
    print(f"{args.bench}: {len(table):,} rows; each GPU type held out in turn ({elapsed:.0f} s)")
    print_rows("pooled over the held-out types", {v: metrics(table, predicted[v]) for v in VARIANTS})
    for gpu in GPU_TYPES:
        rows = {v: predicted[v][predicted[v]["held_out"] == gpu] for v in VARIANTS}
        if len(rows["measured"]):
            title = f"{GPU_TYPES[gpu].short} held out ({len(rows['measured']):,} rows)"
            print_rows(title, {v: metrics(table, rows[v]) for v in VARIANTS})


if __name__ == "__main__":
    main()
