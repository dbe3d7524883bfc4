"""`finetwin report` and `build_report`: the files they write, a section without data, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.report import build_report, latest_report
from calibrate.report.markdown import fmt
from finetwin.cli import main
from finetwin.settings import Settings
from tests.report.conftest import row, write_bench

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "data"
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(directory))
    return directory


def small_bench(path: Path) -> Path:
    return write_bench(
        path,
        [
            row(tps=1000, gpus=1, batch=4),
            row(tps=1900, gpus=2, batch=8),
            row(gpus=2, batch=3),
            row(gpus=1, batch=64),
            row(tps=1100, gpus=1, batch=4, fast_kernels=True),
        ],
    )


def test_cli_writes_report_figures_numbers_and_the_latest_pointer(tmp_path: Path, data_dir: Path) -> None:
    bench = small_bench(tmp_path / "bench.csv")
    out = tmp_path / "report"
    assert main(["report", "--bench", str(bench), "--out", str(out)]) == 0
    numbers = json.loads((out / "numbers.json").read_text())
    assert numbers["table1"]["NVIDIA-A100-SXM4-80GB"]["experiments"] == 5
    assert numbers["failure_by_batch_size"]["4"]["runs"] == 2
    figures = [out / name for name in numbers["figures"].values() if name]
    assert len(figures) >= 4
    for figure in figures:
        assert figure.read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    for question in ("Will the job run?", "How fast?", "Will it scale?", "How to go faster?"):
        assert question in report
    assert all(f"({figure.name})" in report for figure in figures)  # every figure is linked from report.md
    pointer = latest_report(Settings())
    assert pointer is not None
    assert Path(pointer["report_md"]) == (out / "report.md").resolve()
    assert (data_dir / "reports" / "latest.json").is_file()


def test_build_report_from_code_and_a_file_without_multi_node_or_pairs(tmp_path: Path) -> None:
    bench = write_bench(
        tmp_path / "l40s.csv",
        [
            row(tps=3000, gpu="L40S", batch=1),
            row(tps=4000, gpu="L40S", batch=8),
            row(gpu="L40S", batch=256),
        ],
    )
    report = build_report(bench, tmp_path / "out")
    numbers = report.numbers
    assert numbers["weak_scaling"]["per_doubling"] == {} and numbers["weak_scaling"]["campaigns"] == {}
    assert numbers["roce"]["all"] == {"pairs": 0, "median": None, "q25": None, "q75": None, "iqr": None,
                                      "gpu_hours_saved_pct": None}  # fmt: skip
    assert numbers["fast_moe"]["by_expert_parallel_degree"] == {}
    assert numbers["figures"]["speedups"] is None and numbers["figures"]["efficiency"] is None
    assert numbers["figures"]["failures"] is not None
    text = report.report_md.read_text()
    assert "No data per campaign: no experiment ran multi-node jobs both with and without RoCE" in text
    assert "No data for RoCE" in text and "No data for fast kernels" in text
    assert "No data: no configuration ran on two GPU types" in text
    # No run at batch 128: the gain is not known, and said so without a unit after the dash.
    assert "Gain batch 8 vs 1: 1.33×; batch 128 vs 8: —;" in text
    assert report.figures["single_gpu"] is not None and report.figures["single_gpu"].is_file()


@pytest.mark.parametrize(
    ("value", "digits", "suffix", "text"),
    [(-0.4, 0, " %", "0 %"), (-0.004, 2, "×", "0.00×"), (-0.6, 0, " %", "-1 %"), (-1234.5, 1, "", "-1,234.5"),
     (0.0, 0, " %", "0 %"), (None, 2, "×", "—")],
)  # fmt: skip
def test_a_number_that_rounds_to_zero_has_no_sign_and_a_missing_one_no_unit(
    value: float | None, digits: int, suffix: str, text: str
) -> None:
    assert fmt(value, digits, suffix) == text


def test_a_file_where_nothing_ran_says_so(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "failed.csv", [row(gpus=2, batch=3), row(batch=1024)])
    report = build_report(bench, tmp_path / "out")
    text = report.report_md.read_text()
    assert "No data: no valid single-GPU run" in text
    assert report.numbers["throughput_grid"]["max_median"] is None
    assert report.numbers["table1"]["NVIDIA-A100-SXM4-80GB"]["valid_pct"] == 0.0
    assert report.figures["failures"] is not None and report.figures["grid"] is not None


def test_a_file_with_only_a_header_reports_no_data_everywhere(tmp_path: Path) -> None:
    empty = write_bench(tmp_path / "empty.csv", [])
    report = build_report(empty, tmp_path / "out")
    assert report.numbers["table1"] == {} and report.numbers["failure_by_batch_size"] == {}
    assert all(path is None for path in report.figures.values())
    text = report.report_md.read_text()
    assert "No data: the input holds no experiments" in text
    assert text.count("_No data") >= 8


def test_a_bad_csv_exits_non_zero_naming_row_and_column(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = small_bench(tmp_path / "bench.csv")
    lines = bench.read_text().splitlines()
    lines[3] = lines[3].replace(",3.0,", ",three,", 1)  # the batch size of the row on line 4
    assert ",three," in lines[3]
    bench.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert main(["report", "--bench", str(bench), "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "line 4" in error and "batch_size" in error and "'three'" in error
    assert not out.exists()
    assert latest_report(Settings()) is None


def test_nothing_to_report_on_is_a_user_error(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `report` alone reports on the bundled sample (tests/test_operator_outputs.py); observed runs only, on a
    # store that has none, is nothing to report on.
    assert main(["report", "--observed"]) == 2
    error = capsys.readouterr().err
    assert "no observed runs in" in error and "--bench" in error
    assert latest_report(Settings()) is None
