"""What the benchmarks share: timing, the table they print, and the planner's statistics of a store they
filled (each run as `python bench/X.py`, which puts this directory first on the import path)."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Engine, text

T = TypeVar("T")


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest wall time of `repeat` calls: the one least disturbed by the rest of the machine."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


# (figure, value, the baseline it is compared with or None, what the baseline is)
Row = tuple[str, float, float | None, str]


def print_table(rows: Sequence[Row], value: str = "value", baseline: str = "baseline") -> None:
    """Each figure with its baseline and the ratio of the two, one run on one machine."""
    width = max(len(row[0]) for row in rows)
    print(f"{'figure':{width}}  {value:>10}  {baseline:>10}  {'ratio':>8}  baseline is")
    for figure, measured, base, what in rows:
        shown_base = f"{base:10.3f}" if base is not None else ""
        ratio = f"{measured / base:8.4f}" if base else ""
        print(f"{figure:{width}}  {measured:10.3f}  {shown_base:>10}  {ratio:>8}  {what}")


def analyze(engine: Engine) -> None:
    """PostgreSQL's statistics of the freshly filled tables, as autovacuum gathers them on a store that has
    run for months (where autovacuum is off, as on the test machine's server, the planner would guess a
    few hundred rows where there are 166,000, and pick plans no running store gets)."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:  # committed: statistics gathered in a rolled-back one are lost
            connection.execute(text("ANALYZE"))


def small_and_large(
    measure: Callable[[str, int, Path], T], small: int, large: int, database_url: str | None
) -> tuple[T, T]:
    """`measure(url, size, directory)` on a small SQLite store and on a large one (`database_url`, an empty
    database, else SQLite), both in one temporary directory: a figure beside the same figure on a store
    that has run for less long."""
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        return (
            measure(f"sqlite:///{work / 'small.db'}", small, work),
            measure(database_url or f"sqlite:///{work / 'large.db'}", large, work),
        )
