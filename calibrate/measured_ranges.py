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
    their values (the row holds them): one text per size, so that a file of 100,000 configurations beyond
    them costs milliseconds (a text per row cost 0.17 s)."""
    said = np.full(config_frame.row_count(table), "", dtype=object)
    for name in SIZE_COLUMNS:
        if not ranges or name not in ranges:
            continue
        low, high = (int(v) for v in ranges[name])
        values = config_frame.column(table, name).astype(np.int64)
        outside = np.flatnonzero((values < low) | (values > high))
        text = f"{name} outside the {low:,}-{high:,} the models learned from"
        earlier = said[outside]
        said[outside] = np.where(earlier != "", earlier + "; " + text, text)
    rows = np.flatnonzero(said != "")
    return rows, said[rows] + ": extrapolated"
