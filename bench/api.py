"""Job advice latency over HTTP: `POST /v1/advise` for one configuration, 50 concurrent clients.

    .venv/bin/python bench/api.py [--clients 50] [--seconds 10] [--models-dir DIR]

Runs `finetwin api` (uvicorn) in a subprocess on a fresh store with the calibrated models in use (fitted
on the bundled benchmark sample unless --models-dir points at a registry), and loads it from this process
with one keep-alive connection per client (a minimal HTTP/1.1 client: httpx would spend more CPU per
request than the server does, on the same two cores). Each client sends its next request as soon as its
previous answer arrives (closed loop), or one request per second each (paced: 50 requests per second
offered, latency counted from when a request was due). Scenarios:

- in process, without HTTP: what computing one answer costs (mostly the models' one call);
- baseline: GET /healthz (one `SELECT 1` in the thread pool), the HTTP stack and the clients;
- the same configuration from every client: the target (answers are cached per model version, and a
  repeated request is answered before FastAPI parses it, see advisor.fastpath);
- a new configuration each time, cold: the worst case (every answer needs the models; concurrent ones
  share one model call, see advisor.batching);
- a new configuration each time whose candidate rows were predicted for earlier answers (the usual
  case once a provider's model x GPU x sequence-length families have been asked, advisor.prediction_memo);
- the baseline: the same server with FINETWIN_ADVICE_FAST_PATH=false, FINETWIN_ADVICE_MAX_BATCH=1 and
  FINETWIN_ADVICE_MEMO_ROWS=0 (every request through FastAPI, one model call per answer).

Prints p50 / p99 latency, the 25 ms p99 target and the ratio p99 / target, and throughput. Server and
clients share the machine's cores, so the clients' own CPU time is inside the latencies; closed-loop
latency is the number of clients divided by the throughput, whatever the endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvloop

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the packages, not bench/twin.py or bench/ingest.py, answer `import twin`
TARGET_P99_MS = 25.0
FINETWIN = str(Path(sys.executable).with_name("finetwin"))

BASE = {
    "model_name": "llama3-8b", "method": "lora", "gpu_model": "NVIDIA-A100-SXM4-80GB", "number_gpus": 4,
    "number_nodes": 1, "batch_size": 16, "tokens_per_sample": 2048, "fast_kernels": True,
    "dataset_tokens": 5e8,
}  # fmt: skip
MODELS = ("llama3-8b", "granite-3-8b", "mistral-7b-v0.1", "llama3.1-70b", "mixtral-8x7b-instruct-v0.1")
GPUS = ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "L40S", "NVIDIA-H100-PCIe")


SEQUENCE_LENGTHS = (1024, 2048, 4096)
EXHAUSTED = object()
COLD_SPAN = 200_000  # configurations per seed (more than a run asks); seeds 0-3 keep sequences <= 1e6


def distinct_configs(seed: int, *, cold: bool) -> Iterator[dict[str, object]]:
    """Configurations never asked before (each has its own dataset_tokens: no answer is cached).

    cold: each also has its own sequence length, so none of its ~100 candidate rows was predicted for an
    earlier answer (every answer costs a model call). Otherwise the sequence length is one of three, and
    after `families()` has been asked most of its rows were predicted before (advisor.prediction_memo)."""
    rng = random.Random(seed)
    for i in range(COLD_SPAN):
        yield (
            BASE | {
                "model_name": rng.choice(MODELS), "method": rng.choice(("full", "lora")),
                "gpu_model": rng.choice(GPUS), "number_gpus": rng.choice((1, 2, 4, 8)),
                "batch_size": rng.choice((4, 8, 16, 32, 64, 128)),
                "tokens_per_sample": 513 + seed * COLD_SPAN + i if cold else rng.choice(SEQUENCE_LENGTHS),
                "dataset_tokens": 1e8 + seed * COLD_SPAN + i,
            }
        )  # fmt: skip


def families() -> list[dict[str, object]]:
    """One request per (model, method, GPU, sequence length): together they predict the batch x GPUs x
    nodes grid that the warm configurations of `distinct_configs` search."""
    combinations = itertools.product(MODELS, ("full", "lora"), GPUS, SEQUENCE_LENGTHS)
    return [
        BASE
        | {"model_name": m, "method": method, "gpu_model": g, "tokens_per_sample": t, "dataset_tokens": 1}
        for m, method, g, t in combinations
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class RawClient:
    """One keep-alive HTTP/1.1 connection that sends prebuilt requests and reads Content-Length answers.

    Not httpx: an httpx request costs the client ~0.5-1 ms of CPU, and with server and clients on the same
    two cores that CPU would be counted as the server's latency. This client costs tens of microseconds.
    """

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)

    def request_bytes(self, body: dict[str, object] | None) -> bytes:
        head = f"Host: 127.0.0.1:{self.port}\r\nX-API-Key: {self.key}\r\n"
        if body is None:
            return f"GET /healthz HTTP/1.1\r\n{head}\r\n".encode()
        payload = json.dumps(body).encode()
        return (
            f"POST /v1/advise HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload

    async def send(self, request: bytes) -> int:
        """Sends one request, reads the whole answer, returns its status code."""
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()


async def load(  # type: ignore[no-untyped-def]
    port: int,
    key: str,
    clients: int,
    seconds: float,
    bodies,
    interval_s: float | None = None,
    *,
    until_exhausted: bool = False,
) -> tuple[list[float], int]:
    """Each client has its own connection. Closed loop (`interval_s` None): a client sends its next request
    when its previous answer is in. Paced: a client sends one request every `interval_s` (random phase),
    so `clients / interval_s` requests per second are offered; `until_exhausted`: until `bodies` runs
    out instead of for `seconds`; latency is measured from the moment the
    request was due, so a client held up by a slow answer counts the delay (no coordinated omission).
    A body of None means GET /healthz (the baseline: the HTTP stack and the clients, without advice)."""
    latencies: list[float] = []
    errors = 0
    rng = random.Random(7)
    pool = [RawClient(port, key) for _ in range(clients)]
    await asyncio.gather(*(c.connect() for c in pool))  # connections first, then the clock starts
    cache: dict[int, bytes] = {}
    stop = time.perf_counter() + seconds

    def encoded(client: RawClient, body: dict[str, object] | None) -> bytes:
        # The same body object (the cached scenarios) is encoded once: keeps the clients' CPU out of it.
        found = cache.get(id(body))
        if found is None:
            found = client.request_bytes(body)
            if body is None or body is BASE:
                cache[id(body)] = found
        return found

    async def one_client(client: RawClient) -> None:
        nonlocal errors
        due = time.perf_counter() + (rng.uniform(0, interval_s) if interval_s else 0.0)
        while True:
            if interval_s:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)  # the pacing of the offered load, not a wait for a result
            else:
                due = time.perf_counter()
            if due >= stop and not until_exhausted:
                return
            body = next(bodies, EXHAUSTED)
            if body is EXHAUSTED:
                return
            request = encoded(client, body)
            status = await client.send(request)
            latencies.append((time.perf_counter() - due) * 1000.0)
            errors += status != 200
            if interval_s:
                due += interval_s

    try:
        await asyncio.gather(*(one_client(c) for c in pool))
    finally:
        await asyncio.gather(*(c.close() for c in pool))
    return latencies, errors


def prepare_models(models_dir: Path | None, work: Path) -> Path:
    if models_dir is not None:
        return models_dir
    from calibrate.loader import bundled_benchmark_path
    from calibrate.refit import calibrate_version

    target = work / "models"
    began = time.perf_counter()
    result = calibrate_version(target, benchmarks=[bundled_benchmark_path()], reason="bench")
    print(
        f"fitted {result.version} on the bundled sample in {time.perf_counter() - began:.1f} s",
        file=sys.stderr,
    )
    return target


def in_process(models: Any, n: int = 30) -> tuple[str, float, float, float, float, int]:
    """advise_job itself, without HTTP: what one uncached answer costs (mostly the models' call)."""
    from advisor.advice import advise_job
    from advisor.advice_schemas import AdviceRequest

    timings = []
    for body in itertools.islice(distinct_configs(seed=3, cold=True), n):
        config, work = AdviceRequest.model_validate(body).to_job()
        began = time.perf_counter()
        advise_job(config, work, models)
        timings.append((time.perf_counter() - began) * 1000.0)
    p50, p99 = percentile(timings, 0.5), percentile(timings, 0.99)
    return ("in process: advise_job, uncached (no HTTP)", 1000.0 / p50, p50, p99, p99 / TARGET_P99_MS, 0)


def warm_up_cost(models: Any) -> tuple[str, float, float, float, float, int]:
    """What warming the memo with the bundled benchmark's families costs (advisor.warmup), in process."""
    from advisor.prediction_memo import PredictionMemo
    from advisor.warmup import benchmark_families, warm
    from calibrate.loader import bundled_benchmark_path

    families = benchmark_families([bundled_benchmark_path()])
    began = time.perf_counter()
    rows = warm(PredictionMemo("bench", 1_000_000), models, families)
    seconds = time.perf_counter() - began
    print(f"warm-up: {len(families)} families, {rows:,} rows predicted in {seconds:.1f} s", file=sys.stderr)
    name = f"in process: warm-up of {len(families)} families/s"
    return (name, len(families) / seconds, seconds * 1000, seconds * 1000, math.nan, 0)


@contextlib.contextmanager
def api_server(env: dict[str, str]) -> Iterator[int]:
    """`finetwin api` on a free port, warmed up (models loaded, BASE answered); yields the port."""
    port = free_port()
    server = subprocess.Popen(
        [FINETWIN, "api", "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the API did not start")
            time.sleep(0.1)  # waiting for another process's port: nothing to await
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def measure(
    port: int, key: str, name: str, clients: int, seconds: float, bodies: Iterator, interval: float | None
) -> tuple[str, float, float, float, float, int]:
    latencies, errors = uvloop.run(load(port, key, clients, seconds, bodies, interval))
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    return (name, len(latencies) / seconds, p50, p99, p99 / TARGET_P99_MS, errors)


def warm_up(port: int, key: str) -> None:
    url = f"http://127.0.0.1:{port}"
    check = httpx.post(url + "/v1/advise", json=BASE, headers={"X-API-Key": key}, timeout=60)
    if check.status_code != 200:
        raise SystemExit(f"advise failed: {check.status_code} {check.text[:300]}")
    uvloop.run(load(port, key, 4, 2.0, itertools.repeat(BASE)))  # models loaded, answer cached


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--models-dir", type=Path, default=None)
    args = parser.parse_args()
    n, seconds = args.clients, args.seconds

    with tempfile.TemporaryDirectory(prefix="finetwin-bench-api-") as tmp:
        work = Path(tmp)
        models_dir = prepare_models(args.models_dir, work)
        from calibrate.registry import load_models_in_use

        models = load_models_in_use(models_dir)
        rows = [in_process(models), warm_up_cost(models)]
        env = {
            **os.environ, "FINETWIN_DATA_DIR": str(work / "data"), "FINETWIN_DATABASE_URL": "",
            "FINETWIN_MODELS_DIR": str(models_dir),
            "FINETWIN_SCHEDULER_ENABLED": "false", "FINETWIN_KAFKA_BOOTSTRAP": "",
            # No warm-up of the memo with the benchmark's families: it would run during the first scenarios,
            # and the warm scenarios below ask their own families first (in_process times the warm-up).
            "FINETWIN_ADVICE_WARM_MEMO": "false",
        }  # fmt: skip
        key = subprocess.run(
            [FINETWIN, "keys", "create", "--role", "viewer", "--name", "bench"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        cold = distinct_configs(seed=1, cold=True)
        warm = distinct_configs(seed=2, cold=False)
        with api_server(env) as port:
            warm_up(port, key)
            scenarios = [
                (f"baseline: {n} clients, GET /healthz (DB)", n, itertools.repeat(None), None),
                (f"baseline: {n} clients x 1 req/s, /healthz (DB)", n, itertools.repeat(None), 1.0),
                (f"{n} clients, one config (cached)", n, itertools.repeat(BASE), None),
                (f"{n} clients x 1 req/s, one config (cached)", n, itertools.repeat(BASE), 1.0),
                ("1 client, new configs (cold)", 1, cold, None),
                (f"{n} clients, new configs (cold)", n, cold, None),
                (f"{n} clients x 1 req/s, new configs (cold)", n, cold, 1.0),
            ]
            for name, clients, bodies, interval in scenarios:
                rows.append(measure(port, key, name, clients, seconds, bodies, interval))
            # A few clients: small batches, into which the family's rows without fast kernels ride along.
            uvloop.run(load(port, key, 4, 0.0, iter(families()), None, until_exhausted=True))
            for name, clients, bodies, interval in [
                ("1 client, new configs (family asked before)", 1, warm, None),
                (f"{n} clients, new configs (family asked before)", n, warm, None),
                (f"{n} clients x 1 req/s, new (family asked)", n, warm, 1.0),
            ]:
                rows.append(measure(port, key, name, clients, seconds, bodies, interval))
        # The baseline: the same server without the fast path, batching or memo (one model call per answer).
        plain = {
            **env, "FINETWIN_ADVICE_FAST_PATH": "false", "FINETWIN_ADVICE_MAX_BATCH": "1",
            "FINETWIN_ADVICE_MEMO_ROWS": "0",
        }  # fmt: skip
        with api_server(plain) as port:
            warm_up(port, key)
            for name, clients, bodies, interval in [
                (f"plain: {n} clients, one config (cached)", n, itertools.repeat(BASE), None),
                (f"plain: {n} clients, new configs (cold)", n, cold, None),
            ]:
                rows.append(measure(port, key, name, clients, seconds, bodies, interval))

    print(
        f"{'scenario':<46}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'target p99':>12}{'ratio':>8}{'errors':>8}"
    )
    for name, rate, p50, p99, ratio, errors in rows:
        print(f"{name:<46}{rate:>8.0f}{p50:>9.1f}{p99:>9.1f}{TARGET_P99_MS:>10.0f}ms{ratio:>8.2f}{errors:>8}")
    by_name = {row[0]: row for row in rows}
    for fast, plain_name in [
        (f"{n} clients, one config (cached)", f"plain: {n} clients, one config (cached)"),
        (f"{n} clients, new configs (cold)", f"plain: {n} clients, new configs (cold)"),
    ]:
        print(
            f"{fast}: {by_name[fast][1] / by_name[plain_name][1]:.1f}x the requests/s of '{plain_name}', "
            f"p99 {by_name[fast][3]:.1f} vs {by_name[plain_name][3]:.1f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
