"""`--bench bundled` names the bundled real sample wherever a benchmark CSV is asked for: `report` took the
word, and `backtest`, `replay`, `calibrate` and `up --replay` read it as a file name ("bundled: cannot
open")."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from finetwin.cli import main
from finetwin.commands.options import bench_option, bundled_or_file
from finetwin.wiring import bundled_benchmark_path


def backtest(capsys: pytest.CaptureFixture[str], models: Path) -> dict:  # type: ignore[type-arg]
    command = ["backtest", "--bench", "bundled", "--models", str(models), "--runs", "1", "--window", "0:1h"]
    status = main([*command, "--json"])
    out = capsys.readouterr()
    assert status == 0, out.err
    return json.loads(out.out)  # type: ignore[no-any-return]


def test_backtest_takes_the_word_for_the_bundled_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], registry_copy: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    bundled_rows = len(pd.read_csv(bundled_benchmark_path()))
    assert backtest(capsys, registry_copy)["jobs_in_benchmark"] == bundled_rows
    # A file of that name where it is run is the file: the word never hides one.
    pd.read_csv(bundled_benchmark_path()).head(40).to_csv(tmp_path / "bundled", index=False)
    assert backtest(capsys, registry_copy)["jobs_in_benchmark"] == 40


def test_every_bench_option_reads_the_word(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    sample = bundled_benchmark_path()
    assert bundled_or_file(Path("bundled")) == sample
    assert bench_option([Path("bundled"), Path("mine.csv")]) == [sample, Path("mine.csv")]  # calibrate's
    assert bench_option(None) is None and bundled_or_file(Path("Bundled")) == Path("Bundled")
    from finetwin.cli import command

    group = command()
    for path in (("backtest",), ("replay",), ("calibrate",), ("up",)):
        found = group
        for name in path:
            found = found.commands[name]
        option = next(p for p in found.params if {"--bench", "--replay"} & set(p.opts))
        assert option.callback is not None and "'bundled'" in option.help, path
