"""The backtest's machinery: with models that know the truth, the twin reproduces what happened."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pytest

from twin.backtest import demand_cluster, parse_window, replay_benchmark, run_backtest
from twin.domain import JobConfig
from twin.simulator import End
from twin.workload import catalog_key


class OracleModels:
    """Each configuration's measured throughput (zero-width band) and its measured outcome."""

    def __init__(self, table: pd.DataFrame) -> None:
        replay = replay_benchmark(table, demand_cluster(table), np.random.default_rng(0))
        w = replay.workload
        self.tps: dict[object, float] = {}
        self.valid: dict[object, float] = {}
        self.power: dict[object, float] = {}
        for row, k in enumerate(w.config_idx):
            key = catalog_key(w.catalog[k])
            self.power[key] = float(replay.truth_power_w[row])
            self.valid[key] = float(replay.truth_outcome[row] == End.COMPLETED)
            self.tps[key] = float(replay.truth_tokens_per_s[row]) if self.valid[key] else 1.0

    def predict_throughput(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.repeat([[self.tps[catalog_key(c)]] for c in configs], 3, axis=1)

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.array([self.valid[catalog_key(c)] for c in configs])

    def predict_power_watts(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return np.array([self.power[catalog_key(c)] for c in configs])


@pytest.fixture(scope="module")
def unique_rows(sample_csv) -> pd.DataFrame:
    from calibrate.loader import load_benchmark

    table = load_benchmark(sample_csv)
    # One row per configuration and protocol, so that "the configuration's throughput" is one number.
    columns = ["model_name", "method", "gpu_model", "number_gpus", "number_nodes", "batch_size",
               "tokens_per_sample", "enable_roce", "fast_moe", "fast_kernels", "experiment_id",
               "identifier"]  # fmt: skip
    return table.drop_duplicates(subset=columns).reset_index(drop=True)


@pytest.mark.parametrize("window", [None, "6h:18h"])
def test_oracle_models_reproduce_the_replay(unique_rows: pd.DataFrame, window: str | None) -> None:
    doc = run_backtest(
        unique_rows, OracleModels(unique_rows), window=parse_window(window), runs=2, seed=4, workers=1
    )
    figures = doc["figures"]
    assert doc["jobs_in_window"] > 100
    if window is None:
        assert figures["jobs_completed"]["error"] == 0.0
    else:  # a job running at the window's start past its drawn failure time is taken to have survived it
        assert abs(figures["jobs_completed"]["error"]) < 0.01
    # Runtime failures strike at a random time (the benchmark does not record when): the only difference.
    assert abs(figures["gpu_hours"]["error"]) < 0.02
    assert abs(figures["makespan_s"]["error"]) < 0.05
    # Energy over the jobs whose rows measured their power: the same runs at the same power.
    assert 0 < doc["energy_jobs"] < doc["jobs_in_window"]
    assert figures["energy_kwh"]["truth"] > 0 and abs(figures["energy_kwh"]["error"]) < 0.02
    # Waits in a loaded queue are chaotic: a few jobs failing earlier or later reshuffle the queue.
    assert abs(figures["wait_mean_s"]["error"]) < 0.4


def test_window_parsing() -> None:
    assert parse_window(None) == (0.0, float("inf"))
    assert parse_window("0:24h") == (0.0, 86400.0)
    assert parse_window("12h:") == (43200.0, float("inf"))
    for bad in ("24h", "2h:1h", "x:y"):
        with pytest.raises(ValueError):
            parse_window(bad)


@pytest.mark.slow
def test_backtest_command_calibrates_on_the_benchmark(
    sample_csv, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from finetwin.cli import main

    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    assert main(["backtest", "--bench", str(sample_csv), "--window", "9h:1h"]) == 2
    assert "--window: the window ends before it starts" in capsys.readouterr().err
    header_only = tmp_path / "header.csv"
    header_only.write_text(sample_csv.read_text().splitlines()[0] + "\n")
    assert main(["backtest", "--bench", str(header_only)]) == 2  # was an IndexError
    assert f"{header_only}: no rows to replay (a header and no data rows)" in capsys.readouterr().err
    few = tmp_path / "few.csv"
    few.write_text("\n".join(sample_csv.read_text().splitlines()[:4]) + "\n")
    assert main(["backtest", "--bench", str(few)]) == 2  # was a ValueError traceback from the fit
    error = " ".join(capsys.readouterr().err.split())
    assert f"cannot calibrate the backtest's models on {few}: need at least 12 valid runs" in error, error
    assert "give --models DIR" in error
    assert main(["backtest", "--bench", str(sample_csv), "--window", "0:12h", "--runs", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["models"] == f"calibrated on {sample_csv.name}" and doc["jobs_in_window"] > 500
    # Models calibrated on this very benchmark: the GPU-hours of the window's jobs within 10 %.
    assert abs(doc["figures"]["gpu_hours"]["error"]) <= 0.10
    assert abs(doc["figures"]["jobs_completed"]["error"]) <= 0.05


class DoubtingOracle(OracleModels):
    """The oracle's throughput and power, but a coin flip on whether a job that runs will run."""

    def predict_failure(self, configs: Sequence[JobConfig]) -> np.ndarray:
        return 0.5 * super().predict_failure(configs)


def test_energy_is_compared_on_the_runs_that_were_measured(unique_rows: pd.DataFrame) -> None:
    # Only valid runs carry measured power. A twin that doubts every job burns half of it in its runs, yet
    # if these jobs run (as the measured ones did) it knows exactly what they draw: the energy figure is that.
    doc = run_backtest(unique_rows, DoubtingOracle(unique_rows), runs=2, seed=4, workers=1)
    figures = doc["figures"]
    assert abs(figures["energy_kwh"]["error"]) < 0.02
    assert figures["jobs_completed"]["error"] < -0.3  # the doubts do show where they belong
    assert figures["gpu_hours"]["error"] < -0.1
