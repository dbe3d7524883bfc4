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

from calibrate.loader import distinct_rows_of, distinct_values
from twin.domain import METHODS, JobConfig, name_key
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


Table = pd.DataFrame | Mapping[str, Any]  # a frame, or columns by name (each a sequence of one length)


def configs_to_columns(configs: Sequence[JobConfig]) -> dict[str, np.ndarray]:
    """The loader's columns for JobConfigs, as arrays by name: what `configs_to_frame` holds, without the
    frame (pandas' per-column costs were a third of an answer's ~70-row prediction)."""
    columns: dict[str, Any] = {name: [getattr(c, name) for c in configs] for name in CONFIG_FIELDS}
    for key in DESCRIPTOR_COLUMNS:
        default = OPTIONAL_COLUMNS[key]
        columns[key] = [c.extra.get(key, default) for c in configs]
    # As the loader does for a benchmark row: a protocol with `stop_after_seconds` is time-limited.
    columns["time_limit_s"] = [c.run_limit_s for c in configs]
    arrays = {name: np.asarray(columns[name]) for name in (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)}
    arrays["time_limit_s"] = arrays["time_limit_s"].astype(float)
    return arrays


def configs_to_frame(configs: Sequence[JobConfig]) -> pd.DataFrame:
    """The loader's column layout for JobConfigs, so they go through the same features as benchmark rows."""
    return pd.DataFrame(configs_to_columns(configs), columns=[*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS])


def column_names(table: Table) -> list[str]:
    return list(table.columns) if isinstance(table, pd.DataFrame) else list(table)


def column(table: Table, name: str) -> np.ndarray:
    """One column of a frame or a mapping as a numpy array."""
    values = table[name]
    return values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)


def row_count(table: Table) -> int:
    if isinstance(table, pd.DataFrame):
        return len(table)
    return len(next(iter(table.values()))) if len(table) else 0


# The columns a prediction reads (`validated_configs`', and through it the features', the admission rules'
# and the novelty's): rows equal in all of them get the same prediction.
PREDICTION_INPUTS: tuple[str, ...] = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)


def distinct_rows(table: Table) -> tuple[np.ndarray, np.ndarray]:
    """(the position of the first row of each distinct configuration, in row order; each row's index into
    them). Cells are compared as they are (a missing cell equals a missing cell; `8` and `"8"` differ, which
    only costs a repeat)."""
    present = [name for name in PREDICTION_INPUTS if name in set(column_names(table))]
    return distinct_rows_of((column(table, name) for name in present), row_count(table))


def take(table: Table, rows: np.ndarray) -> Table:
    """The rows at these positions, of a frame (a frame, fresh index) or of columns by name."""
    if isinstance(table, pd.DataFrame):
        return table.iloc[rows].reset_index(drop=True)
    return {name: np.asarray(values)[rows] for name, values in table.items()}


def records_to_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """`configs_to_frame` for configurations as mappings (telemetry payloads, API bodies)."""
    return configs_to_frame([config_from_row(record) for record in records])


def validated_configs(table: Table) -> dict[str, np.ndarray]:
    """The configuration columns of `table` (a frame or columns by name) as arrays, typed, trimmed and
    lower-cased, missing optional ones filled. Plain arrays, not a frame: pandas' per-column costs dominated
    advice-sized tables.

    Raises ValueError naming the row (position) and column of an impossible value."""
    present = set(column_names(table))
    missing = [c for c in REQUIRED_COLUMNS if c not in present]
    if missing:
        raise ValueError(f"missing configuration columns: {', '.join(missing)}")
    frame: dict[str, np.ndarray] = {}
    for name in ("model_name", "method", "gpu_model"):
        frame[name] = _text(column(table, name), lower=name != "gpu_model")
    _check(~np.isin(frame["method"], METHODS), "method", f"must be one of {', '.join(METHODS)}")
    _check(frame["model_name"] == "", "model_name", "is empty")
    for name in ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample"):
        values = _numbers(column(table, name))
        _check(~(values >= 1), name, "must be a number of at least 1")
        frame[name] = values
    n = row_count(table)
    for name, default in OPTIONAL_COLUMNS.items():
        if name not in present:
            frame[name] = np.full(n, default, dtype=object if isinstance(default, str) else None)
            continue
        values = column(table, name)
        if name in ("enable_roce", "fast_kernels"):
            frame[name] = _filled(values, False).astype(bool)
        elif name == "fast_moe":
            numbers = np.nan_to_num(_numbers(values), nan=0.0)
            _check(numbers < 0, name, "must not be negative")
            frame[name] = numbers
        elif name == "time_limit_s":
            frame[name] = _numbers(values)
        else:
            frame[name] = _text(_filled(values, default))
    return frame


def _filled(values: np.ndarray, default: Any) -> np.ndarray:
    """Missing cells (None, NaN) replaced by `default`, as `Series.fillna` would."""
    if values.dtype.kind in "biu":
        return values
    missing = pd.isna(values)
    if not missing.any():
        return values
    out = values.astype(object)
    out[missing] = default
    return out


def _text(values: np.ndarray, *, lower: bool = False) -> np.ndarray:
    """Each value as trimmed (and, if asked, lower-cased) text, computed once per distinct value (a CSV
    repeats a few hundred)."""
    codes, distinct = distinct_values(values)
    texts = [name_key(value) if lower else str(value).strip() for value in distinct]
    return np.array(texts, dtype=object)[codes]


def _numbers(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind in "iufb":
        return values.astype(float)
    return pd.to_numeric(values, errors="coerce").astype(float)


def _check(bad: np.ndarray, column: str, message: str) -> None:
    bad_array = np.asarray(bad, dtype=bool)
    if bad_array.any():
        row = int(np.argmax(bad_array))
        raise ValueError(f"row {row}: column {column!r} {message}")
