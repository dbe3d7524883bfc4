"""Configurations as the one table the features are built from: the loader's column layout.

Training reads benchmark rows (loader output) and serving reads configurations from anywhere (telemetry
payloads, API bodies, store rows, `JobConfig`s): every serving path goes `config_from_row` ->
`configs_to_frame`, which fills what the loader derives for a benchmark row (the time cap from
`experiment_id`, the benchmark's GPU name), so a configuration gets the same features whichever way it
came (tests/calibrate/test_models_parts.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from calibrate.loader import time_limit_seconds
from twin.domain import METHODS, JobConfig
from twin.job_config import (
    CONFIG_DEFAULTS,
    CONFIG_FIELDS,
    DESCRIPTOR_FIELDS,
    REQUIRED_FIELDS,
    config_from_row,
)

# Columns a frame needs for `build_features` (what a JobConfig must state); the others have defaults: the
# JobConfig's own, and the loader's for the benchmark's descriptors.
REQUIRED_COLUMNS: tuple[str, ...] = REQUIRED_FIELDS
DESCRIPTOR_COLUMNS: tuple[str, ...] = DESCRIPTOR_FIELDS
OPTIONAL_COLUMNS: dict[str, Any] = {
    **{name: np.nan if default is None else default for name, default in CONFIG_DEFAULTS.items()},
    "experiment_id": "",
    "identifier": "",
    "fms_hf_tuning_version": "",
    "torch_dtype": "bfloat16",
}


def configs_to_frame(configs: Sequence[JobConfig]) -> pd.DataFrame:
    """The loader's column layout for JobConfigs, so they go through the same features as benchmark rows."""
    rows = []
    for config in configs:
        row: dict[str, Any] = {name: getattr(config, name) for name in CONFIG_FIELDS}
        for key in DESCRIPTOR_COLUMNS:
            row[key] = config.extra.get(key, OPTIONAL_COLUMNS[key])
        # As the loader does for a benchmark row: a protocol with `stop_after_seconds` is time-limited.
        row["time_limit_s"] = (
            time_limit_seconds(row["experiment_id"])
            if config.time_limit_s is None
            else float(config.time_limit_s)
        )
        rows.append(row)
    table = pd.DataFrame(rows, columns=[*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS])
    return table.astype({"time_limit_s": float})


def records_to_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """`configs_to_frame` for configurations as mappings (telemetry payloads, API bodies)."""
    return configs_to_frame([config_from_row(record) for record in records])


def validated_configs(table: pd.DataFrame) -> pd.DataFrame:
    """The configuration columns of `table`, typed, trimmed and lower-cased, missing optional ones filled.

    Raises ValueError naming the row (position) and column of an impossible value."""
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"missing configuration columns: {', '.join(missing)}")
    frame = pd.DataFrame(index=table.index)
    for column in ("model_name", "method", "gpu_model"):
        frame[column] = table[column].astype(str).str.strip()
    frame["model_name"] = frame["model_name"].str.lower()
    frame["method"] = frame["method"].str.lower()
    _check(frame, ~frame["method"].isin(METHODS), "method", f"must be one of {', '.join(METHODS)}")
    _check(frame, frame["model_name"] == "", "model_name", "is empty")
    for column in ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample"):
        values = pd.to_numeric(table[column], errors="coerce")
        _check(frame, ~(values >= 1), column, "must be a number of at least 1")
        frame[column] = values.to_numpy(dtype=float)
    for column, default in OPTIONAL_COLUMNS.items():
        if column not in table.columns:
            frame[column] = default
        elif column in ("enable_roce", "fast_kernels"):
            frame[column] = table[column].fillna(False).astype(bool).to_numpy()
        elif column == "fast_moe":
            values = pd.to_numeric(table[column], errors="coerce").fillna(0.0)
            _check(frame, values < 0, column, "must not be negative")
            frame[column] = values.to_numpy(dtype=float)
        elif column == "time_limit_s":
            frame[column] = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
        else:
            frame[column] = table[column].fillna(default).astype(str).str.strip().to_numpy()
    return frame


def _check(frame: pd.DataFrame, bad: pd.Series, column: str, message: str) -> None:
    bad_array = np.asarray(bad, dtype=bool)
    if bad_array.any():
        row = int(np.argmax(bad_array))
        raise ValueError(f"row {row}: column {column!r} {message}")
