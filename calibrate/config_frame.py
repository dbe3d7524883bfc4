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


def validated_configs(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """The configuration columns of `table` as arrays, typed, trimmed and lower-cased, missing optional
    ones filled. Plain arrays, not a frame: pandas' per-column costs dominated advice-sized tables.

    Raises ValueError naming the row (position) and column of an impossible value."""
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"missing configuration columns: {', '.join(missing)}")
    frame: dict[str, np.ndarray] = {}
    for column in ("model_name", "method", "gpu_model"):
        frame[column] = _text(table[column])
    frame["model_name"] = np.array([name.lower() for name in frame["model_name"]], dtype=object)
    frame["method"] = np.array([method.lower() for method in frame["method"]], dtype=object)
    _check(~np.isin(frame["method"], METHODS), "method", f"must be one of {', '.join(METHODS)}")
    _check(frame["model_name"] == "", "model_name", "is empty")
    for column in ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample"):
        values = _numbers(table[column])
        _check(~(values >= 1), column, "must be a number of at least 1")
        frame[column] = values
    n = len(table)
    for column, default in OPTIONAL_COLUMNS.items():
        if column not in table.columns:
            frame[column] = np.full(n, default, dtype=object if isinstance(default, str) else None)
        elif column in ("enable_roce", "fast_kernels"):
            frame[column] = table[column].fillna(False).astype(bool).to_numpy()
        elif column == "fast_moe":
            values = np.nan_to_num(_numbers(table[column]), nan=0.0)
            _check(values < 0, column, "must not be negative")
            frame[column] = values
        elif column == "time_limit_s":
            frame[column] = _numbers(table[column])
        else:
            frame[column] = _text(table[column].fillna(default))
    return frame


def _text(column: pd.Series) -> np.ndarray:
    return np.array([str(value).strip() for value in column.to_numpy()], dtype=object)


def _numbers(column: pd.Series) -> np.ndarray:
    if column.dtype.kind in "iuf":
        return column.to_numpy(dtype=float)
    return pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)


def _check(bad: np.ndarray, column: str, message: str) -> None:
    bad_array = np.asarray(bad, dtype=bool)
    if bad_array.any():
        row = int(np.argmax(bad_array))
        raise ValueError(f"row {row}: column {column!r} {message}")
