"""Configurations from anywhere (telemetry payloads, API bodies, store rows) as a loader-shaped table, the
one shape `CalibratedModels.predict_frame` takes, so every caller predicts from the same columns."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from calibrate.loader import time_limit_seconds
from twin.domain import broken_rule, canonical_gpu_name

_INTEGERS = ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample", "fast_moe")
_TEXT_DEFAULTS = {
    "experiment_id": "",
    "identifier": "",
    "fms_hf_tuning_version": "",
    "torch_dtype": "bfloat16",
}


def configs_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per configuration with the loader's configuration columns, `time_limit_s` and `rule`.

    `time_limit_s` comes from the record, else from a `stop_after_seconds` in its experiment id, as the
    loader does for benchmark rows.
    """
    rows = []
    for record in records:
        row: dict[str, Any] = {
            "model_name": str(record["model_name"]),
            "method": str(record["method"]).strip().lower(),
            "gpu_model": canonical_gpu_name(str(record["gpu_model"])),
            **{name: int(record.get(name) or 0) for name in _INTEGERS},
            "enable_roce": bool(record.get("enable_roce") or False),
            "fast_kernels": bool(record.get("fast_kernels") or False),
        }
        for name, default in _TEXT_DEFAULTS.items():
            value = record.get(name)
            row[name] = str(value) if value not in (None, "") else default
        limit = record.get("time_limit_s")
        row["time_limit_s"] = float(limit) if _number(limit) else time_limit_seconds(row["experiment_id"])
        rule = broken_rule(row["number_gpus"], row["batch_size"], row["fast_moe"], row["number_nodes"])
        row["rule"] = rule.value if rule is not None else None
        rows.append(row)
    columns = ["model_name", "method", "gpu_model", *_INTEGERS, "enable_roce", "fast_kernels"]
    columns += [*_TEXT_DEFAULTS, "time_limit_s", "rule"]
    table = pd.DataFrame.from_records(rows, columns=columns)
    for name in _INTEGERS:
        table[name] = table[name].astype(np.int64)
    table["time_limit_s"] = table["time_limit_s"].astype(float)
    return table


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
