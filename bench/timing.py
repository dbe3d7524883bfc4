"""What the benchmarks share: timing, and the planner's statistics of a store they filled (each run as
`python bench/X.py`, which puts this directory first on the import path)."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Engine, text


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest wall time of `repeat` calls: the one least disturbed by the rest of the machine."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def analyze(engine: Engine) -> None:
    """PostgreSQL's statistics of the freshly filled tables, as autovacuum gathers them on a store that has
    run for months (where autovacuum is off, as on the test machine's server, the planner would guess a
    few hundred rows where there are 166,000, and pick plans no running store gets)."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:  # committed: statistics gathered in a rolled-back one are lost
            connection.execute(text("ANALYZE"))
