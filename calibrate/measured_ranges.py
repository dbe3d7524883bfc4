"""The sizes a version learned from, and a note for a configuration beyond them.

The models answer for any size (the throughput trees start from a physics bound that scales), but an
answer for 65,536 GPUs from runs of 1-32 is an extrapolation, and it read like any other (50 M tokens/s,
confidence "high"). A version keeps the smallest and largest value of each size its training rows held
(`info["measured_ranges"]`); a prediction beyond them says so in its `note`, as it does for a model name
never seen. Versions saved before keep no ranges and add no note.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from calibrate import config_frame
from calibrate.config_frame import Table

# The sizes a configuration is scaled by; the names, GPU types and flags are the note of an unseen name.
SIZE_COLUMNS: tuple[str, ...] = ("number_gpus", "number_nodes", "batch_size", "tokens_per_sample")


def measured_ranges(table: Table, rows: np.ndarray) -> dict[str, list[int]]:
    """[smallest, largest] of each size over the rows (a boolean mask) the models learned from."""
    ranges: dict[str, list[int]] = {}
    for name in SIZE_COLUMNS:
        values = config_frame.column(table, name)[rows].astype(np.int64)
        if len(values):
            ranges[name] = [int(values.min()), int(values.max())]
    return ranges


def beyond_measured(table: Table, ranges: Mapping[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows with a size outside `ranges` (positions) and each one's note. A note names the sizes, not
    their values (the row holds them): one text per set of sizes a row is outside, so that a file of 100,000
    configurations beyond them costs milliseconds (a text per row cost 0.17 s; joining each row's texts,
    ~25 ms)."""
    outside = np.zeros(config_frame.row_count(table), dtype=np.int64)  # bit k: outside SIZE_COLUMNS[k]
    texts: list[str] = []
    for bit, name in enumerate(SIZE_COLUMNS):
        if ranges and name in ranges:
            low, high = (int(v) for v in ranges[name])
            values = config_frame.column(table, name).astype(np.int64)
            outside |= ((values < low) | (values > high)).astype(np.int64) << bit
            texts.append(f"{name} outside the {low:,}-{high:,} the models learned from")
        else:
            texts.append("")  # never said: no row has this bit
    rows = np.flatnonzero(outside)
    sets, each = np.unique(outside[rows], return_inverse=True)
    notes = [
        "; ".join(text for bit, text in enumerate(texts) if int(found) >> bit & 1) + ": extrapolated"
        for found in sets.tolist()
    ]
    return rows, np.array(notes, dtype=object)[each.reshape(-1)]
