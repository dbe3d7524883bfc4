"""The training data of one fit: benchmark rows and observed runs in one table, with each row's weight,
a fingerprint per row and one for the whole set, and the row counts per source.

Row fingerprints are what lets a later fit rebuild exactly which rows an earlier version learned from (to
compare the two fairly) and tell whether anything is new since.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from calibrate.loader import CONFIG_COLUMNS, each_distinct, load_benchmark
from calibrate.observed import OBSERVED_SOURCE, implausible_runs, observed_weights

# What makes two rows the same data point: the configuration, the protocol's time cap and what happened.
HASHED_COLUMNS: tuple[str, ...] = (*CONFIG_COLUMNS, "time_limit_s", "outcome", "dataset_tokens_per_second")
ROW_HASH_CHARS = (
    16  # 64 bits of the sha256: no collision in any realistic number of rows, a quarter of the size
)


@dataclass(frozen=True)
class WeightPolicy:
    """How much an observed run counts relative to a benchmark row (see `observed_weights`)."""

    observed_weight: float = 5.0
    half_life_days: float = 30.0


@dataclass
class TrainingData:
    table: pd.DataFrame  # loader columns + `source`
    weights: np.ndarray
    row_hashes: np.ndarray  # str, one per row
    benchmarks: list[dict[str, object]] = field(default_factory=list)  # path, rows, sha256 of each file
    left_out: dict[str, int] = field(default_factory=dict)  # rows not learned from, by why (`assemble`)

    @property
    def fingerprint(self) -> str:
        """sha256 of the set of training rows (order does not matter, duplicates do)."""
        return hashlib.sha256("\n".join(sorted(self.row_hashes)).encode()).hexdigest()

    @property
    def rows_by_source(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.table["source"].value_counts(sort=False).items()}

    def __len__(self) -> int:
        return len(self.table)

    def subset(self, mask: np.ndarray) -> TrainingData:
        return TrainingData(
            self.table[mask].reset_index(drop=True),
            self.weights[mask],
            self.row_hashes[mask],
            self.benchmarks,
            self.left_out,
        )


def benchmark_source(path: Path) -> str:
    return f"benchmark:{path.name}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_benchmarks(paths: Sequence[Path]) -> tuple[list[pd.DataFrame], list[dict[str, object]]]:
    """Each file through the loader (raises BenchmarkFormatError), tagged with its source."""
    tables, described = [], []
    for path in paths:
        table = load_benchmark(path)
        table["source"] = benchmark_source(Path(path))
        tables.append(table)
        described.append({"path": str(Path(path).resolve()), "rows": len(table), "sha256": file_sha256(path)})
    return tables, described


def assemble(
    benchmarks: Sequence[pd.DataFrame],
    observed: pd.DataFrame | None,
    *,
    now: datetime,
    policy: WeightPolicy,
    described: Sequence[dict[str, object]] = (),
) -> TrainingData:
    """One table of every row (benchmarks first, in file order, then observed runs by job). Left out, and
    counted in `left_out`:
    - a benchmark row given again (the same identifier, configuration and measured throughput, in one file
      or another): read twice, it made its own held-out neighbour, and the band shrank (coverage 66 % where
      the file read once gives 87 %);
    - an observed run whose measurements no hardware makes (`calibrate.observed.implausible_runs`): one run
      of 1e300 tokens/s, valid to the telemetry's schema, made the next version predict 4e299."""
    parts, hashes, left_out, seen = [], [], {}, set()
    for benchmark in (t for t in benchmarks if len(t)):
        own = row_hashes(benchmark)
        again = pd.Series(own).duplicated().to_numpy() | np.isin(own, list(seen))
        seen.update(own.tolist())
        if again.any():
            repeated = left_out.get("repeated benchmark rows", 0)
            left_out["repeated benchmark rows"] = repeated + int(again.sum())
        parts.append(benchmark[~again])
        hashes.append(own[~again])
    weights = [np.ones(len(t)) for t in parts]
    if observed is not None and len(observed):
        implausible = implausible_runs(observed)
        if implausible.any():
            left_out["implausible observed runs"] = int(implausible.sum())
            observed = observed[~implausible]
    if observed is not None and len(observed):
        parts.append(observed)
        hashes.append(row_hashes(observed))
        weights.append(
            observed_weights(
                observed["observed_at"],
                now,
                weight=policy.observed_weight,
                half_life_days=policy.half_life_days,
            )
        )
    if not any(len(t) for t in parts):
        empty = pd.DataFrame(columns=[*HASHED_COLUMNS, "source"])
        return TrainingData(empty, np.ones(0), np.array([], str), list(described), left_out)
    table = pd.concat(parts, ignore_index=True, sort=False)
    table["source"] = table["source"].fillna(OBSERVED_SOURCE)
    return TrainingData(table, np.concatenate(weights), np.concatenate(hashes), list(described), left_out)


def row_hashes(table: pd.DataFrame) -> np.ndarray:
    """A short sha256 of each row's identity (HASHED_COLUMNS), stable across processes and platforms."""
    if not len(table):
        return np.array([], dtype=str)
    missing = np.full(len(table), None, dtype=object)
    # Each column's text once per distinct value: a calibration of 30,920 rows spent 0.6 s formatting cells.
    parts = [
        each_distinct(
            table[column].to_numpy(dtype=object) if column in table.columns else missing, _canonical
        )
        for column in HASHED_COLUMNS
    ]
    return np.array(
        [
            hashlib.sha256(("\x1f" + "\x1f".join(row)).encode()).hexdigest()[:ROW_HASH_CHARS]
            for row in zip(*parts, strict=True)
        ],
        dtype=f"<U{ROW_HASH_CHARS}",
    )


def _canonical(value: object) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, bool | np.bool_):
        return "1" if value else "0"
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        number = float(value)
        return str(int(number)) if number.is_integer() else repr(number)
    return str(value)
