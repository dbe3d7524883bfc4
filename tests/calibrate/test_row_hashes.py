"""Row hashes name the training rows of every stored model version: the same row must hash alike whatever
the types pandas gave its cells, and a release must not change a stored row's hash."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from calibrate.dataset import HASHED_COLUMNS, ROW_HASH_CHARS, row_hashes
from calibrate.loader import bundled_benchmark_path, load_benchmark


def _reference_hash(row: list[str]) -> str:
    """The stored format, spelled out: the canonical text of each hashed column after a unit separator."""
    text = "".join("\x1f" + cell for cell in row)
    return hashlib.sha256(text.encode()).hexdigest()[:ROW_HASH_CHARS]


def test_a_row_hashes_to_the_stored_format() -> None:
    row = {column: None for column in HASHED_COLUMNS} | {
        "model_name": "llama3-8b",
        "number_gpus": 8,
        "batch_size": 16.0,
        "dataset_tokens_per_second": 1234.5,
        "outcome": "valid",
    }
    expected = _reference_hash(
        ["llama3-8b" if c == "model_name" else "8" if c == "number_gpus" else "16" if c == "batch_size"
         else "1234.5" if c == "dataset_tokens_per_second" else "valid" if c == "outcome" else ""
         for c in HASHED_COLUMNS]
    )  # fmt: skip
    assert row_hashes(pd.DataFrame([row]))[0] == expected


def test_equal_cells_of_other_types_hash_alike_and_missing_columns_are_empty() -> None:
    base = load_benchmark(bundled_benchmark_path()).head(3).reset_index(drop=True)
    table = pd.concat([base.iloc[[0]]] * 6, ignore_index=True)
    table["number_gpus"] = pd.Series([8, 8.0, np.int64(8), np.float32(8), "8", 9], dtype=object)
    hashes = row_hashes(table)
    assert len(set(hashes[:4])) == 1  # numbers equal in value are the same cell
    assert hashes[4] == hashes[0]  # ... and so is their text
    assert hashes[5] != hashes[0]

    flags = pd.concat([base.iloc[[0]]] * 4, ignore_index=True)
    flags["enable_roce"] = pd.Series([True, 1, None, np.nan], dtype=object)
    flag_hashes = row_hashes(flags)
    assert flag_hashes[0] == flag_hashes[1]
    assert flag_hashes[2] == flag_hashes[3] != flag_hashes[0]

    without = base.drop(columns=["time_limit_s"])
    assert (row_hashes(without) == row_hashes(base.assign(time_limit_s=None))).all()
