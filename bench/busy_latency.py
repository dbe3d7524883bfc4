"""Advice latency while the API runs the twin: `POST /v1/advise` of new configurations, paced, while a
steering run evaluates its candidates (what-ifs, on the API's niced worker processes) and while a capacity
plan sweeps (a local pool of worker processes), with this checkout's settings and with the settings before
them (`FINETWIN_API_SWITCH_INTERVAL_MS=5`, Python's default; `FINETWIN_TWIN_WORKER_NICE=0`, the workers at
the API's priority), or with another checkout's code (`--baseline DIR`, on the same store and models), one
server after the other in the same run.

    .venv/bin/python bench/busy_latency.py [--rate 20] [--rounds 2] [--baseline DIR]

The store is the bundled sample replayed by `finetwin up --speed 0` (its cluster, queue and arrivals) with
the models `finetwin calibrate` fits on it; the scheduler is off, so nothing else runs. Each round: a steering
run (`POST /v1/recommendations/run`, which answers when it is done) and a plan (`POST /v1/plan`, polled until
done), each with the requests offered at `--rate` per second throughout, and then as long with nothing
running. Latency is measured from when each request was due (no coordinated omission).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from api import REPO, api_server, distinct_configs, finetwin, percentile, tree_env, warm_up
from timing import Row, print_table

BEFORE = {"FINETWIN_API_SWITCH_INTERVAL_MS": "5", "FINETWIN_TWIN_WORKER_NICE": "0"}
PLAN = {"vary": ["NVIDIA-A100-SXM4-80GB=3..8", "L40S=0..2"], "policies": ["fifo", "backfill"], "runs": 16}


def prepare(work: Path) -> tuple[dict[str, str], str]:
    """A store with the replayed cluster and a model in use; the environment and an operator's key."""
    env = tree_env(REPO, {
        "FINETWIN_DATA_DIR": str(work / "data"), "FINETWIN_DATABASE_URL": "", "FINETWIN_KAFKA_BOOTSTRAP": "",
        "FINETWIN_SCHEDULER_ENABLED": "false", "FINETWIN_ADVICE_WARM_MEMO": "false",
    })  # fmt: skip
    run = [*finetwin(REPO)]
    subprocess.run([*run, "up", "--speed", "0", "--exit-when-done", "--port", "0"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([*run, "calibrate"], env=env, check=True, capture_output=True)
    key = subprocess.run([*run, "keys", "create", "--role", "operator", "--name", "bench"], env=env,
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    return env, key


def paced(port: int, key: str, rate: float, until: Callable[[], bool], seed: int) -> list[float]:
    """Requests of new configurations at `rate` per second until `until()`; each one's latency in ms from
    when it was due."""
    configs = distinct_configs(seed, cold=True)
    latencies: list[float] = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": key}, timeout=120) as client:
        start = time.perf_counter()
        n = 0
        while not until():
            due = start + n / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing the offered load: the schedule, not an event, decides
            answer = client.post("/v1/advise", json=next(configs))
            latencies.append((time.perf_counter() - due) * 1000.0)
            if answer.status_code != 200:
                raise SystemExit(f"advise failed: {answer.status_code} {answer.text[:300]}")
            n += 1
    return latencies


@contextlib.contextmanager
def in_background(work: Callable[[], object]) -> Iterator[threading.Event]:
    """`work()` on a thread; yields the event set when it is done."""
    done = threading.Event()

    def run() -> None:
        try:
            work()
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield done
    thread.join()


def steering(port: int, key: str) -> None:
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/recommendations/run", headers={"X-API-Key": key},
                        timeout=600)  # fmt: skip
    if answer.status_code != 200:
        raise SystemExit(f"steering failed: {answer.status_code} {answer.text[:300]}")


def plan(port: int, key: str) -> None:
    headers = {"X-API-Key": key}
    started = httpx.post(f"http://127.0.0.1:{port}/v1/plan", json=PLAN, headers=headers, timeout=60)
    if started.status_code != 202:
        raise SystemExit(f"plan failed: {started.status_code} {started.text[:300]}")
    while True:
        status = httpx.get(f"http://127.0.0.1:{port}/v1/plan/{started.json()['id']}", headers=headers).json()
        if status["status"] in ("done", "failed"):
            return
        time.sleep(0.5)  # polling another process's progress: it offers nothing to await


def measure(env: dict[str, str], key: str, rate: float, rounds: int, tree: Path = REPO) -> dict[str, float]:
    samples: dict[str, list[float]] = {"steering": [], "plan": [], "idle": []}
    walls: dict[str, float] = {"steering": 0.0, "plan": 0.0}
    with api_server(tree, tree_env(tree, env)) as port:
        warm_up(port, key)
        for round_ in range(rounds):
            for name, work in (("steering", steering), ("plan", plan)):
                began = time.perf_counter()
                with in_background(lambda w=work: w(port, key)) as done:
                    samples[name] += paced(port, key, rate, done.is_set, seed=2 * round_ + (name == "plan"))
                wall = time.perf_counter() - began
                walls[name] += wall / rounds
                quiet_until = time.perf_counter() + wall
                samples["idle"] += paced(port, key, rate, lambda t=quiet_until: time.perf_counter() > t,
                                         seed=10 + 2 * round_ + (name == "plan"))  # fmt: skip
    out = {f"{name} wall (s)": wall for name, wall in walls.items()}
    for name, values in samples.items():
        out[f"advise p50 {name} (ms)"] = percentile(values, 0.50)
        out[f"advise p99 {name} (ms)"] = percentile(values, 0.99)
        out[f"advise max {name} (ms)"] = max(values)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20.0, help="advice requests offered per second")
    parser.add_argument("--rounds", type=int, default=3, help="steering runs and plans, each")
    parser.add_argument(
        "--baseline", type=Path, metavar="DIR", help="another checkout to compare with (the same store)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        env, key = prepare(Path(directory))
        print(f"store and models ready; {args.rounds} rounds at {args.rate:g} requests/s", file=sys.stderr)
        now = measure(env, key, args.rate, args.rounds)
        if args.baseline is None:
            before, what = measure(env | BEFORE, key, args.rate, args.rounds), "the settings before"
        else:
            tree = args.baseline.resolve()
            before, what = measure(env, key, args.rate, args.rounds, tree), f"the code of {tree}"
    rows: list[Row] = [(name, now[name], before[name], what) for name in now]
    print_table(rows, value="now", baseline="before")


if __name__ == "__main__":
    main()
