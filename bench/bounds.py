"""What hardening ingest costs (issue 10): CPU per message of the worker's bounded fast path against the
contract's own parser, and CPU per time value read from PostgreSQL with the lenient loaders (a time Python
cannot hold reads as None) against psycopg's own.

CPU time (this process), best of several rounds: wall-clock figures swing with whatever else the machine runs.

    .venv/bin/python bench/bounds.py [--pg postgresql://postgres@127.0.0.1:5432/test] [--rows 200000]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibrate.loader import bundled_benchmark_path, load_benchmark  # noqa: E402
from ingest.events import parse_event  # noqa: E402
from ingest.fastparse import decode_event  # noqa: E402
from ingest.replay import plan_replay  # noqa: E402
from twin.db import register_lenient_time_loaders  # noqa: E402

ROUNDS = 7


def best_cpu_s(action: Callable[[], object], rounds: int = ROUNDS) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        action()
        best = min(best, time.process_time() - started)
    return best


def parsing() -> tuple[float, float]:
    """µs of CPU per message: the fast path (bounded), and `parse_event` (the contract)."""
    raws = [event.to_json() for _, event in plan_replay(load_benchmark(bundled_benchmark_path())).events]
    fast = best_cpu_s(lambda: [decode_event(raw) for raw in raws])
    contract = best_cpu_s(lambda: [parse_event(raw) for raw in raws], rounds=3)
    return fast / len(raws) * 1e6, contract / len(raws) * 1e6


def reading_times(url: str, rows: int) -> tuple[float, float]:
    """µs of CPU per timestamptz value read: the lenient loaders, and psycopg's own."""
    import psycopg

    query = f"SELECT now() - (g || ' s')::interval FROM generate_series(1, {rows}) g"
    with psycopg.connect(url) as strict, psycopg.connect(url) as lenient:
        register_lenient_time_loaders(lenient)
        own = best_cpu_s(lambda: strict.execute(query).fetchall())
        ours = best_cpu_s(lambda: lenient.execute(query).fetchall())
    return ours / rows * 1e6, own / rows * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    fast, contract = parsing()
    lenient, strict = reading_times(args.pg, args.rows)
    print(f"{'figure':<52} {'value':>9} {'baseline':>9} {'ratio':>6}")
    print(f"{'fast path, µs CPU per message (baseline parse_event)':<52} {fast:9.2f} {contract:9.2f} "
          f"{fast / contract:6.2f}")  # fmt: skip
    print(f"{'time read, µs CPU per value (baseline psycopg own)':<52} {lenient:9.2f} {strict:9.2f} "
          f"{lenient / strict:6.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
