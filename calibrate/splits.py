"""Held-out splits of a benchmark table, the two kinds the accuracy targets are stated on.

- random: a random share of the rows (15 %), like rows drawn from the rest of the benchmark;
- block: contiguous blocks of the file. The published file is sorted by configuration, so a block is a
  configuration region (a protocol, a model, a GPU type) that the training rows never saw.

Splits are positions (for `DataFrame.iloc`) in file order, deterministic for a seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

RANDOM = "random"
BLOCK = "block"


@dataclass(frozen=True, slots=True)
class Split:
    kind: str  # RANDOM or BLOCK
    fold: int  # the seed of a random split, the block's number of a block split
    train: np.ndarray  # positions of the training rows
    test: np.ndarray  # positions of the held-out rows


def file_order(table: pd.DataFrame) -> np.ndarray:
    """Positions of the rows in the order of the file (the loader's `line`), else as given."""
    if "line" in table.columns:
        return np.argsort(table["line"].to_numpy(), kind="stable")
    return np.arange(len(table))


def random_holdout(table: pd.DataFrame, *, fraction: float = 0.15, seed: int = 0) -> Split:
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    n = len(table)
    n_test = max(1, int(round(n * fraction)))
    order = np.random.default_rng(seed).permutation(n)
    return Split(RANDOM, seed, np.sort(order[n_test:]), np.sort(order[:n_test]))


def hashed_holdout(row_hashes: Sequence[str], *, fraction: float = 0.15, seed: int = 0) -> Split:
    """A random share of the rows chosen by each row's own fingerprint (`calibrate.dataset.row_hashes`), not
    by its place among the others: a row is held out in every table that holds it, for a seed. So a fit on
    one table's training rows never saw a held-out row of another table's split (a model version's
    comparison fit can be scored again on later rows, `calibrate.promotion`), and repeats of a row are all
    held out or all trained on. The held-out share is `fraction` on average, not exactly."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction}")
    cut = int(fraction * 2**32)
    held_out = np.fromiter(
        (
            int.from_bytes(hashlib.sha256(f"{seed}:{h}".encode()).digest()[:4], "big") < cut
            for h in row_hashes
        ),
        dtype=bool,
        count=len(row_hashes),
    )
    return Split(RANDOM, seed, np.flatnonzero(~held_out), np.flatnonzero(held_out))


def random_holdouts(
    table: pd.DataFrame, *, fraction: float = 0.15, seeds: Iterable[int] = range(5)
) -> list[Split]:
    return [random_holdout(table, fraction=fraction, seed=seed) for seed in seeds]


def block_folds(table: pd.DataFrame, *, n_blocks: int = 10) -> list[Split]:
    """`n_blocks` contiguous, equal-sized blocks of the file; each is held out once."""
    n = len(table)
    if not 2 <= n_blocks <= n:
        raise ValueError(f"n_blocks must be between 2 and the number of rows ({n}), got {n_blocks}")
    order = file_order(table)
    bounds = np.linspace(0, n, n_blocks + 1).round().astype(int)
    splits = []
    for fold, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        test = order[start:stop]
        train = np.concatenate([order[:start], order[stop:]])
        splits.append(Split(BLOCK, fold, np.sort(train), np.sort(test)))
    return splits


GPU_OUT = "gpu-out"
MODEL_OUT = "model-out"
# A model is held out on its own only with this many rows: fewer say little about it.
MIN_ROWS_PER_HELD_OUT_MODEL = 100


def leave_one_group_out(table: pd.DataFrame, column: str, kind: str, *, min_rows: int = 1) -> list[Split]:
    """Every row of one value of `column` held out at a time (a GPU type, an LLM), for each value with at
    least `min_rows` rows: what a provider meets when it adds a GPU type or a model."""
    values = table[column].astype(str).to_numpy()
    names, counts = np.unique(values, return_counts=True)
    splits = []
    for fold, name in enumerate(n for n, c in zip(names, counts, strict=True) if c >= min_rows):
        held_out = values == name
        if held_out.all():
            continue
        splits.append(Split(kind, fold, np.flatnonzero(~held_out), np.flatnonzero(held_out)))
    return splits
