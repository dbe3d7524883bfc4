"""Where the commands write, and what they read by default, as an operator meets them: an output path the
system refuses (`/proc`, where no directory can be made, even by root) is a clear error with exit 2, never
a traceback; `report` without --bench reports on the bundled sample, as calibrate and replay do; `advise`
without models says where it looked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetwin.cli import main

CONFIGS = (
    "method,model_name,number_nodes,gpu_model,number_gpus,tokens_per_sample,batch_size,enable_roce,fast_moe,"
    "fast_kernels\nlora,llama3-8b,1,NVIDIA-A100-SXM4-80GB,2,2048,8,0,0,0\n"
)
UNWRITABLE = Path("/proc/finetwin-no-such-dir")


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("FINETWIN_MODELS_DIR", raising=False)
    monkeypatch.delenv("FINETWIN_DATABASE_URL", raising=False)


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_predict_to_a_path_that_cannot_be_written_is_a_clear_error(
    calibrated_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = tmp_path / "configs.csv"
    configs.write_text(CONFIGS)
    target = UNWRITABLE / "pred.csv"
    argv = [
        "predict",
        "--models",
        str(calibrated_models_dir),
        "--input",
        str(configs),
        "--output",
        str(target),
    ]
    assert main(argv) == 2
    error = one_line(capsys.readouterr().err)
    assert error.startswith("finetwin predict: error: --output") and "cannot write there" in error, error
    assert "Traceback" not in error


def test_report_to_a_directory_that_cannot_be_made_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["report", "--bench", "bundled", "--out", str(UNWRITABLE / "report")]) == 2
    error = one_line(capsys.readouterr().err)
    assert error.startswith("finetwin report: error:") and "cannot write" in error and "/proc" in error, error


def test_report_defaults_to_the_bundled_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from calibrate.loader import bundled_benchmark_path

    out = tmp_path / "report"
    assert main(["report", "--out", str(out)]) == 0, capsys.readouterr().err
    numbers = json.loads((out / "numbers.json").read_text())
    assert numbers["meta"]["source"] == str(bundled_benchmark_path())
    assert numbers["meta"]["rows"] == 3983


def test_advise_without_models_says_where_it_looked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        "model_name: llama3-8b\nmethod: lora\ngpu_model: L40S\nnumber_gpus: 2\nbatch_size: 8\n"
        "tokens_per_sample: 2048\n"
    )
    assert main(["advise", str(config)]) == 2
    error = one_line(capsys.readouterr().err)
    assert f"no calibrated models yet in {tmp_path / 'data' / 'models'}" in error, error


def test_info_and_keys_list_speak_json_for_scripts(
    registry_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script asked `finetwin info` which model is in use, or `keys list` which keys are live, by parsing
    a table drawn for a terminal."""
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(registry_copy))
    assert main(["info", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["data_dir"] == str((tmp_path / "data").resolve())
    assert (described["model_versions"], described["model_in_use"]) == (1, "v0001")
    assert described["models_problem"] is None
    assert described["store_exists"] is False and described["store"].endswith("finetwin.db")
    assert main(["keys", "create", "--role", "operator", "--name", "ci"]) == 0
    assert main(["keys", "create", "--role", "viewer", "--name", "gone"]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--json"]) == 0
    gone = next(key["id"] for key in json.loads(capsys.readouterr().out) if key["name"] == "gone")
    assert main(["keys", "revoke", gone]) == 0
    capsys.readouterr()
    assert main(["keys", "list", "--json"]) == 0
    listed = {key["name"]: key for key in json.loads(capsys.readouterr().out)}
    assert (listed["ci"]["role"], listed["ci"]["revoked_at"]) == ("operator", None)
    assert listed["gone"]["revoked_at"] is not None
    assert listed["ci"]["created_at"].endswith("+00:00")


def test_info_says_a_registry_it_cannot_read_where_it_was_a_traceback(
    registry_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pointer = registry_copy / "IN_USE.json"
    pointer.write_text("{")
    monkeypatch.setenv("FINETWIN_MODELS_DIR", str(registry_copy))
    assert main(["info"]) == 0
    said = one_line(capsys.readouterr().out)
    assert f"model versions 1 model registry cannot be read: {pointer} cannot be read as JSON" in said, said
    assert main(["info", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert (described["model_versions"], described["model_in_use"]) == (1, None)
    assert described["models_problem"].startswith(f"{pointer} cannot be read as JSON")
