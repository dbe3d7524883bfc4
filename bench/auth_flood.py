"""A flood of unknown API keys against the latency of everyone else's requests.

    .venv/bin/python bench/auth_flood.py [--unknown 3000] [--flooders 20] [--database-url URL]

Runs `finetwin api` (uvicorn) in a subprocess on a fresh store (SQLite unless --database-url, e.g. a
PostgreSQL database), then from this process: a viewer sends `GET /v1/jobs` one request at a time while
`--flooders` connections send `--unknown` requests, each with a different unknown key, as fast as they are
answered. Reported: the viewer's median and p90 latency alone and during the flood, and how many of the
flood's requests the server looked up in the database (401) rather than refused from memory (429).

Baseline: the same server with the limits off (FINETWIN_AUTH_MAX_FAILURES huge,
FINETWIN_AUTH_NEGATIVE_CACHE_SECONDS=0): every unknown key costs a database transaction, as before issue 10.
Server and clients share the machine's cores, so the numbers are relative, not absolute.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

FINETWIN = str(Path(sys.executable).with_name("finetwin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def api_server(env: dict[str, str]) -> Iterator[int]:
    port = free_port()
    process = subprocess.Popen(
        [FINETWIN, "api", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the API did not start")
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def viewer_key(env: dict[str, str]) -> str:
    done = subprocess.run(
        [FINETWIN, "keys", "create", "--role", "viewer", "--name", "bench"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip().splitlines()[-1].strip()


async def viewer_latencies(
    client: httpx.AsyncClient, key: str, stop: asyncio.Event, most: int
) -> list[float]:
    latencies: list[float] = []
    while not stop.is_set() and len(latencies) < most:
        began = time.perf_counter()
        response = await client.get("/v1/jobs", headers={"X-API-Key": key})
        assert response.status_code == 200, response.text
        latencies.append((time.perf_counter() - began) * 1000)
    return latencies


async def flood(base: str, unknown: int, flooders: int) -> dict[int, int]:
    statuses: dict[int, int] = {}
    keys = iter(range(unknown))

    async def one(client: httpx.AsyncClient) -> None:
        for i in keys:
            response = await client.get("/v1/jobs", headers={"X-API-Key": f"ft_{i:012x}_guess"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    clients = [httpx.AsyncClient(base_url=base, timeout=60) for _ in range(flooders)]
    try:
        await asyncio.gather(*(one(c) for c in clients))
    finally:
        for c in clients:
            await c.aclose()
    return statuses


async def scenario(port: int, key: str, unknown: int, flooders: int) -> tuple[list[float], list[float], dict]:
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        for _ in range(10):  # warm: the key verified and cached, connections open
            await client.get("/v1/jobs", headers={"X-API-Key": key})
        quiet = await viewer_latencies(client, key, asyncio.Event(), 100)
        stop = asyncio.Event()
        measuring = asyncio.ensure_future(viewer_latencies(client, key, stop, 10**9))
        statuses = await flood(base, unknown, flooders)
        stop.set()
        during = await measuring
    return quiet, during, statuses


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unknown", type=int, default=3000)
    parser.add_argument("--flooders", type=int, default=20)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    rows = []
    for name, limits in (
        ("baseline (every unknown key looked up)", {
            "FINETWIN_AUTH_MAX_FAILURES": str(10**9), "FINETWIN_AUTH_NEGATIVE_CACHE_SECONDS": "0",
        }),
        ("now (remembered, 30 failures/min/address)", {}),
    ):  # fmt: skip
        with tempfile.TemporaryDirectory() as work:
            env = {
                **os.environ, "FINETWIN_DATA_DIR": work, "FINETWIN_SCHEDULER_ENABLED": "false",
                **limits,
            }  # fmt: skip
            if args.database_url:
                env["FINETWIN_DATABASE_URL"] = args.database_url
            subprocess.run([FINETWIN, "migrate"], env=env, check=True, capture_output=True)
            key = viewer_key(env)
            with api_server(env) as port:
                quiet, during, statuses = asyncio.run(scenario(port, key, args.unknown, args.flooders))
        rows.append((name, statistics.median(quiet), statistics.median(during), p(during, 90), statuses))
    print(f"{args.unknown} unknown keys from {args.flooders} connections; a viewer's GET /v1/jobs meanwhile")
    print(f"{'server':<44}{'alone p50':>10}{'flood p50':>10}{'flood p90':>10}  flood answers")
    for name, alone, p50, p90, statuses in rows:
        answers = ", ".join(f"{n} x {code}" for code, n in sorted(statuses.items()))
        print(f"{name:<44}{alone:>8.1f}ms{p50:>8.1f}ms{p90:>8.1f}ms  {answers}")
    print(f"ratio of the flood p50, baseline / now: {rows[0][2] / rows[1][2]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
