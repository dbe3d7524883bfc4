"""Advice latency while the API refits its models: `POST /v1/advise` of new configurations, paced, before,
during and after a scheduled refit in the same `finetwin api` process, for this checkout and any number of
other checkouts (baselines) in the same run.

    .venv/bin/python bench/refit_latency.py [--clients 10] [--rate 20] [--seconds 90]
        [--baseline NAME=DIR ...]

For each checkout: `finetwin calibrate` on the bundled sample (v0001), then `finetwin api` with its
scheduler on, refitting every 30 s on another resample of the sample (so the refit has new rows and fits,
as it does hourly in a cluster whose runs keep finishing). The clients offer `--rate` requests per second
of configurations never asked before (bench/api.py's), latency measured from when each request was due.
The refit's window comes from the server's log ("refit (schedule): v0002: ... calibrated in X s"). The
table: latency of the requests due inside the window against those outside it, per checkout; the ratio is
inside / outside.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import uvloop
from api import (
    SAMPLE,
    RawClient,
    api_env,
    api_server,
    distinct_configs,
    fit_models,
    percentile,
    viewer_key,
    warm_up,
)

REPO = Path(__file__).resolve().parents[1]


REFIT_DONE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO calibrate\.refit: refit \(schedule\): "
    r"v\d+: .*calibrated in (?P<seconds>[\d.]+) s"
)


def resample(path: Path, seed: int) -> Path:
    raw = pd.read_csv(SAMPLE, dtype=str, keep_default_na=False)
    picked = np.random.default_rng(seed).integers(0, len(raw), size=len(raw))
    raw.iloc[picked].to_csv(path, index=False)
    return path


async def paced(port: int, key: str, clients: int, rate: float, seconds: float) -> list[tuple[float, float]]:
    """(wall time the request was due, latency ms) of every request: each client one request every
    clients / rate seconds, new configurations."""
    bodies = distinct_configs(seed=5, cold=True)
    interval = clients / rate
    pool = [RawClient(port, key) for _ in range(clients)]
    await asyncio.gather(*(c.connect() for c in pool))
    began, stop = time.perf_counter(), time.perf_counter() + seconds
    wall_offset = time.time() - began
    seen: list[tuple[float, float]] = []

    async def one(client: RawClient, phase: float) -> None:
        due = began + phase
        while due < stop:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the pacing of the offered load, not a wait for a result
            status = await client.send(client.request_bytes(next(bodies)))
            if status != 200:
                raise SystemExit(f"advise answered {status}")
            seen.append((due + wall_offset, (time.perf_counter() - due) * 1000.0))
            due += interval

    try:
        await asyncio.gather(*(one(c, i * interval / clients) for i, c in enumerate(pool)))
    finally:
        await asyncio.gather(*(c.close() for c in pool))
    return seen


def refit_window(log: Path) -> tuple[float, float] | None:
    for line in log.read_text().splitlines():
        found = REFIT_DONE.match(line)
        if found:
            # The log's times are the local wall clock, with milliseconds.
            end = datetime.strptime(found["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            return end - float(found["seconds"]), end
    return None


Row = tuple[int, float, float, float]


def summary(latencies: list[float]) -> Row:
    if not latencies:
        return (0, float("nan"), float("nan"), float("nan"))
    return (len(latencies), percentile(latencies, 0.5), percentile(latencies, 0.99), max(latencies))


def measure_tree(tree: Path, clients: int, rate: float, seconds: float) -> dict[str, Row]:
    with tempfile.TemporaryDirectory(prefix="finetwin-bench-refit-") as tmp:
        work = Path(tmp)
        other = resample(work / "other.csv", seed=11)
        env = api_env(
            tree, work, fit_models(tree, work), FINETWIN_SCHEDULER_ENABLED="true",
            FINETWIN_REFIT_INTERVAL_MINUTES="0.5", FINETWIN_REFIT_BENCHMARKS=json.dumps([str(other)]),
        )  # fmt: skip
        key = viewer_key(tree, env)
        log = work / "api.log"
        with api_server(tree, env, log) as port:
            warm_up(port, key)
            seen = uvloop.run(paced(port, key, clients, rate, seconds))
        window = refit_window(log)
        if window is None:
            tail = log.read_text()[-3000:]
            raise SystemExit(f"{tree}: no scheduled refit finished within {seconds:.0f} s: {tail}")
        start, end = window
        print(f"{tree}: refit from +{start - seen[0][0]:.1f} s for {end - start:.1f} s", file=sys.stderr)
        inside = [ms for due, ms in seen if start <= due <= end]
        outside = [ms for due, ms in seen if not start <= due <= end]
        return {"during the refit": summary(inside), "outside it": summary(outside)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rate", type=float, default=20.0, help="requests per second offered, in all")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--baseline", action="append", default=[], metavar="NAME=DIR",
                        help="another checkout to measure in the same run (repeatable)")  # fmt: skip
    args = parser.parse_args()
    trees = {"this checkout": REPO} | {
        name: Path(path).resolve() for name, path in (b.split("=", 1) for b in args.baseline)
    }
    results = {
        name: measure_tree(tree, args.clients, args.rate, args.seconds) for name, tree in trees.items()
    }
    print(f"POST /v1/advise, new configurations, {args.rate:.0f} requests/s from {args.clients} clients")
    print(f"{'requests due':<20}{'checkout':>22}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}")
    for name, rows in results.items():
        for label, (n, p50, p99, worst) in rows.items():
            print(f"{label:<20}{name:>22}{n:>6}{p50:>9.1f}{p99:>9.1f}{worst:>9.1f}")
    print(f"\n{'during / outside':<20}{'checkout':>22}{'p50':>9}{'p99':>9}")
    for name, rows in results.items():
        (_, in50, in99, _), (_, out50, out99, _) = rows["during the refit"], rows["outside it"]
        print(f"{'ratio':<20}{name:>22}{in50 / out50:>9.2f}{in99 / out99:>9.2f}")
    if len(results) > 1:
        base = list(results)[1]
        mine, theirs = results["this checkout"]["during the refit"], results[base]["during the refit"]
        print(f"\nduring the refit, this checkout / {base}: p50 {mine[1] / theirs[1]:.2f}, "
              f"p99 {mine[2] / theirs[2]:.2f}")  # fmt: skip
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
