"""What a flood of what-ifs does to the API: `clients` callers each sending `POST /v1/whatif` (a viewer's key
may: it only computes) one after the other, while `POST /v1/advise` of new configurations is offered at
`--rate` per second, with this checkout's settings (at most `FINETWIN_WHATIF_CONCURRENCY` what-ifs at once,
2 by default; the others answered 429 with Retry-After) and with the limit lifted, as before it
(`FINETWIN_WHATIF_CONCURRENCY=1000`), one server after the other in the same run.

    .venv/bin/python bench/whatif_flood.py [--clients 8] [--seconds 60] [--rate 10]

Each what-if runs two ensembles of 64 runs (the most the API takes) of the replayed cluster; every one of
them forks a pool of worker processes. Printed: advice latency (from when each request was due) during the
flood, the what-ifs answered and refused, and the most processes and memory the API held at once (sampled
every half second: its own process and every descendant).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from api import REPO, api_server, percentile, tree_env, warm_up
from busy_latency import in_background, paced, prepare
from timing import Row, print_table

WHATIF = {
    "runs": 64,
    "horizon": "24h",
    "changes": {"nodes": [{"gpu_model": "NVIDIA-A100-SXM4-80GB", "add": 1}]},
}
BEFORE = {"FINETWIN_WHATIF_CONCURRENCY": "1000"}


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Linux's /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(child) for child in (task / "children").read_text().split()]
        except OSError:  # it ended meanwhile
            continue
    return found


def resident_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024.0


def flood(port: int, key: str, clients: int, until: float, outcomes: dict[int, int]) -> None:
    """`clients` callers, each sending what-ifs one after another until `until`; counts answers by status."""
    lock = threading.Lock()

    def caller() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": key}, timeout=600) as c:
            while time.perf_counter() < until:
                status = c.post("/v1/whatif", json=WHATIF).status_code
                with lock:
                    outcomes[status] = outcomes.get(status, 0) + 1
                if status == 429:
                    time.sleep(1.0)  # a polite client's pause before asking again (Retry-After says 5)

    threads = [threading.Thread(target=caller, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def measure(env: dict[str, str], key: str, clients: int, seconds: float, rate: float) -> dict[str, float]:
    outcomes: dict[int, int] = {}
    peaks = {"processes": 0.0, "memory (MB)": 0.0}
    with api_server(REPO, tree_env(REPO, env)) as port:
        warm_up(port, key)
        server = _serving(port)
        until = time.perf_counter() + seconds
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.5):  # a reading every half second: nothing to await
                pids = descendants(server)
                peaks["processes"] = max(peaks["processes"], len(pids))
                peaks["memory (MB)"] = max(peaks["memory (MB)"], resident_mb(pids))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with in_background(lambda: flood(port, key, clients, until, outcomes)) as done:
            latencies = paced(port, key, rate, done.is_set, seed=3)
        sampling.set()
        sampler.join()
    return {
        "advise p50 (ms)": percentile(latencies, 0.50),
        "advise p99 (ms)": percentile(latencies, 0.99),
        "advise max (ms)": max(latencies),
        "what-ifs answered": float(outcomes.get(200, 0)),
        "what-ifs refused (429)": float(outcomes.get(429, 0)),
        "other answers": float(sum(n for status, n in outcomes.items() if status not in (200, 429))),
        "most processes": peaks["processes"],
        "most memory (MB)": peaks["memory (MB)"],
    }


def _serving(port: int) -> int:
    """The process id of the `finetwin api` serving on `port`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"api" in words and b"--port" in words and str(port).encode() in words:
            return int(entry.name)
    raise SystemExit(f"no finetwin api process serves port {port}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="callers sending what-ifs at once")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the flood lasts")
    parser.add_argument("--rate", type=float, default=10.0, help="advice requests offered per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        env, key = prepare(Path(directory))
        print(f"store and models ready; {args.clients} callers for {args.seconds:g} s", file=sys.stderr)
        now = measure(env, key, args.clients, args.seconds, args.rate)
        before = measure(env | BEFORE, key, args.clients, args.seconds, args.rate)
    rows: list[Row] = [
        (name, now[name], before[name], "no limit (FINETWIN_WHATIF_CONCURRENCY=1000)") for name in now
    ]
    print_table(rows, value="now", baseline="before")


if __name__ == "__main__":
    main()
