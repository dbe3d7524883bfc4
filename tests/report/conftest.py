"""Hand-made LLMFineTuningBench files: every row has all 38 columns of the published schema, written the way
the published file writes them (integers as floats, empty measured columns on runs that did not happen)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pandas as pd

from calibrate.loader import BENCHMARK_COLUMNS

SXM = "NVIDIA-A100-SXM4-80GB"
PCIE = "NVIDIA-A100-80GB-PCIe"
UNCAPPED = "SFTTrainer.finetune_full_benchmark-v1.0.0-fms_hf_tuning_version.2.4.0"
CAPPED = "SFTTrainer.finetune_full_benchmark-v1.0.0-fms_hf_tuning_version.2.7.1-stop_after_seconds.600.0"
FAST_KERNELS_ON = "['True', 'True', 'True']"


def row(
    *,
    tps: float | None = None,
    model: str = "llama3.1-8b",
    method: str = "full",
    gpu: str = SXM,
    gpus: int = 1,
    nodes: int = 1,
    batch: int = 8,
    tokens: int = 512,
    roce: int = 0,
    fast_moe: int = 0,
    fast_kernels: bool = False,
    experiment: str = UNCAPPED,
    version: str = "2.4.0",
    peak: float = 50.0,
    identifier_extra: str = "",
    power: float | None = None,
) -> dict[str, str]:
    """One benchmark row; `tps` (dataset tokens/s) given = a valid run, None = a run that did not happen."""
    identifier = (
        f"model_name.{model}-number_gpus.{gpus}.0-model_max_length.{tokens}.0-batch_size.{batch}.0"
        f"-gpu_model.{gpu}"
    )
    if nodes > 1:
        identifier += f"-number_nodes.{nodes}.0-enable_roce.{roce}.0"
    identifier += identifier_extra
    values: dict[str, Any] = dict.fromkeys(BENCHMARK_COLUMNS, "")
    values.update(
        identifier=identifier,
        experiment_id=experiment + (f"-fast_kernels.{FAST_KERNELS_ON}" if fast_kernels else ""),
        method=method,
        model_name=model,
        number_nodes=f"{nodes}.0",
        gpu_model=gpu,
        number_gpus=f"{gpus}.0",
        tokens_per_sample=f"{tokens}.0",
        batch_size=f"{batch}.0",
        enable_roce=f"{roce}.0",
        fast_moe=f"{fast_moe}.0",
        fast_kernels=FAST_KERNELS_ON if fast_kernels else "",
        fms_hf_tuning_version=version,
        is_valid="1.0" if tps is not None else "0.0",
        lh_created_at="2026-04-15 11:29:43.917375+00:00",
        torch_dtype="bfloat16",
    )
    if tps is not None:
        values.update(
            dataset_tokens_per_second=repr(float(tps)),
            dataset_tokens_per_second_per_gpu=repr(float(tps) / gpus),
            train_runtime="100.0",
            gpu_memory_utilization_peak=repr(float(peak)),
            gpu_memory_utilization_max=repr(float(peak)),
        )
        if power is not None:  # some GPU types report no power at all
            values.update(gpu_power_watts_avg=repr(float(power)), gpu_power_watts_max=repr(float(power)))
    return values


def write_bench(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=BENCHMARK_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return path


# The configuration columns two runs of a pair agree on (besides the identifier and the experiment_id).
CONFIG = [
    "method", "model_name", "number_nodes", "gpu_model", "number_gpus", "tokens_per_sample", "batch_size",
    "enable_roce", "fast_moe", "fast_kernels", "fms_hf_tuning_version", "torch_dtype",
]  # fmt: skip


def pandas_ratios(
    raw: pd.DataFrame, factor: str, a: Any, b: Any, *, strip: str = "", protocol: str = ""
) -> pd.Series:
    """Matched ratios throughput(factor = b) / throughput(factor = a), computed the plain way: group the valid
    runs by everything but the factor (the identifier without the factor's own token, `strip`; the
    experiment_id without its token, `protocol`), take the median per setting and divide."""
    valid = raw[raw.is_valid == 1].copy()
    valid["fast_kernels"] = valid.fast_kernels.notna()
    valid["rest"] = valid.identifier.str.replace(strip, "", regex=True) if strip else valid.identifier
    valid["protocol"] = (
        valid.experiment_id.str.replace(protocol, "", regex=True) if protocol else valid.experiment_id
    )
    keys = ["rest", "protocol", *[c for c in CONFIG if c != factor]]
    medians = valid.groupby([*keys, factor], dropna=False).dataset_tokens_per_second.median().unstack(factor)
    if a not in medians or b not in medians:
        return pd.Series(dtype=float)
    return (medians[b] / medians[a]).dropna()
