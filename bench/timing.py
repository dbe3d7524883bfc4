"""Timing shared by the benchmarks (each run as `python bench/X.py`, which puts this directory first on the
import path)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest wall time of `repeat` calls: the one least disturbed by the rest of the machine."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)
