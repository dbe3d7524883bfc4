"""`finetwin report --observed`: the runs observed through telemetry, from the real store (SQLite and
PostgreSQL), reported like a benchmark file."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine

from finetwin.cli import main
from twin.db import session_scope
from twin.store import Job, ObservedRun

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def job(job_id: str, state: str, outcome: str, *, gpu: str, gpus: int, batch: int, **extra: object) -> Job:
    return Job(
        job_id=job_id, state=state, outcome=outcome, model_name="llama3.1-8b", method="lora", gpu_model=gpu,
        number_gpus=gpus, number_nodes=1, batch_size=batch, tokens_per_sample=1024, enable_roce=False,
        fast_moe=0, fast_kernels=False, experiment_id="observed", identifier=f"job_id.{job_id}",
        updated_at=NOW, ended_at=NOW, **extra,
    )  # fmt: skip


def run(job_id: str, tps: float) -> ObservedRun:
    return ObservedRun(
        job_id=job_id, is_valid=1, observed_at=NOW, train_runtime=60.0, dataset_tokens_per_second=tps,
        gpu_memory_utilization_peak=40.0,
    )  # fmt: skip


def test_observed_runs_make_a_report(engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with session_scope(engine) as session:
        session.add_all(
            [
                job("a", "completed", "valid", gpu="L40S", gpus=1, batch=8),
                job("b", "completed", "valid", gpu="L40S", gpus=1, batch=16),
                job("c", "failed", "runtime", gpu="L40S", gpus=1, batch=64, failure_reason="oom"),
                job("d", "rejected", "rejected", gpu="NVIDIA-H100-PCIe", gpus=2, batch=3, rule="x"),
                job("e", "running", None, gpu="L40S", gpus=1, batch=8),  # not finished: not a run yet
            ]
        )
        session.flush()
        session.add_all([run("a", 3000.0), run("b", 3500.0)])
    monkeypatch.setenv("FINETWIN_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("FINETWIN_DATA_DIR", str(tmp_path / "data"))
    out = tmp_path / "report"
    assert main(["report", "--observed", "--out", str(out)]) == 0
    numbers = json.loads((out / "numbers.json").read_text())
    l40s = numbers["table1"]["L40S"]
    assert (l40s["experiments"], l40s["valid"], l40s["runtime"]) == (3, 2, 1)
    assert numbers["table1"]["NVIDIA-H100-PCIe"]["rejected_pct"] == 100.0
    assert numbers["rejections_by_rule"]["batch_size_not_multiple_of_gpus"] == 1
    single = numbers["throughput_single_gpu"]["by_gpu_model"]["L40S"]["median_tokens_per_s_by_batch"]
    assert {b: c["median"] for b, c in single.items()} == {"8": 3000.0, "16": 3500.0}
    assert "observed runs" in numbers["meta"]["source"]
    assert (out / "report.md").is_file()
