"""Job advice latency over HTTP: `POST /v1/advise`, against issue 14's targets, for this checkout and any
number of other checkouts (baselines) in the same run.

    .venv/bin/python bench/api.py [--clients 50] [--seconds 10] [--baseline NAME=DIR ...]

For each checkout (this one, then each `--baseline`, e.g. a `git archive` of main before a change):
`finetwin calibrate` on the bundled sample with that checkout's code, then `finetwin api` (uvicorn) in a
subprocess with that checkout first on PYTHONPATH, on a fresh store, loaded from this process with one
keep-alive connection per client (a minimal HTTP/1.1 client: httpx would spend more CPU per request than
the server does, on the same two cores). Scenarios, each configuration never asked before (its own
sequence length, so no answer, memo row or family is reused) unless said:

- 1 client, 60 new configurations one after another: p50 <= 10 ms, max <= 40 ms (the whole answer:
  verdict, repair, fewest GPUs, best configuration);
- 50 clients x 1 request/s each (50 requests/s offered, latency from when a request was due, no
  coordinated omission), new configurations: p99 <= 100 ms;
- 50 clients closed loop (each sends its next request when its answer arrives), new configurations:
  reported, no target (closed-loop latency is the number of clients divided by the throughput);
- 50 clients closed loop, the same configuration (answered from the cache);
- 50 clients closed loop, GET /healthz: the HTTP stack and the clients alone.

Server and clients share the machine's cores, and on a shared machine other processes too: compare the
checkouts of one run, not runs. Layers of older checkouts that warm up in the background are turned off
(`FINETWIN_ADVICE_WARM_MEMO=false`), so they do not run during the measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvloop

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "calibrate" / "data" / "llmftbench_sample.csv"
sys.path.insert(0, str(REPO))  # the packages, not bench/twin.py or bench/ingest.py, answer `import twin`

from ingest.broker import free_port, port_open  # noqa: E402

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
    earlier answer (every answer costs a model call, whatever a server remembers). Otherwise the sequence
    length is one of three."""
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


TARGETS_MS = {"1 client p50": 10.0, "1 client max": 40.0, "50 clients x 1/s p99": 100.0}
SINGLE_CLIENT_QUESTIONS = 60


def fit_models(tree: Path, work: Path) -> Path:
    """A registry fitted on the bundled sample by `tree`'s own code (its model format is its own)."""
    target = work / "models"
    began = time.perf_counter()
    subprocess.run(
        [*finetwin(tree), "calibrate", "--bench", str(SAMPLE), "--models", str(target)],
        env=tree_env(tree, {}), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    print(f"{tree}: fitted on the bundled sample in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    return target


def finetwin(tree: Path) -> list[str]:
    """The `finetwin` command of `tree`'s own code (the CLI moved from twin/cli.py to finetwin/cli.py)."""
    module = "finetwin.cli" if (tree / "finetwin" / "cli.py").exists() else "twin.cli"
    # The tree first on sys.path here too: `-c` puts the working directory (maybe another checkout) first.
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from {module} import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def tree_env(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment that runs `finetwin` from `tree`: first on PYTHONPATH, ahead of the editable
    install of this checkout (whose import hook comes after the path)."""
    return {**os.environ, **env, "PYTHONPATH": str(tree)}


def in_process(n: int = SINGLE_CLIENT_QUESTIONS) -> tuple[float, float]:
    """advise_job of this checkout without HTTP (p50, max ms): what computing one new answer costs."""
    from advisor.advice import advise_job
    from advisor.advice_schemas import AdviceRequest
    from calibrate.fit import fit_models as fit
    from calibrate.loader import load_benchmark

    models = fit(load_benchmark(SAMPLE))
    if hasattr(models, "prepare_native"):  # the trees as the server runs them (calibrate/native_trees.py)
        models.prepare_native(wait=True)
    timings = []
    for body in itertools.islice(distinct_configs(seed=3, cold=True), n):
        config, work = AdviceRequest.model_validate(body).to_job()
        began = time.perf_counter()
        advise_job(config, work, models)
        timings.append((time.perf_counter() - began) * 1000.0)
    return percentile(timings, 0.5), max(timings)


def api_env(tree: Path, work: Path, models_dir: Path, **settings: str) -> dict[str, str]:
    """`finetwin api` of `tree` on a fresh store in `work`, the models of `models_dir`, no broker, no
    background warm-up; the scheduler off unless `settings` (FINETWIN_* names) turn it on."""
    return tree_env(tree, {
        "FINETWIN_DATA_DIR": str(work / "data"), "FINETWIN_DATABASE_URL": "",
        "FINETWIN_MODELS_DIR": str(models_dir), "FINETWIN_SCHEDULER_ENABLED": "false",
        "FINETWIN_KAFKA_BOOTSTRAP": "", "FINETWIN_ADVICE_WARM_MEMO": "false", **settings,
    })  # fmt: skip


def viewer_key(tree: Path, env: dict[str, str]) -> str:
    return subprocess.run(
        [*finetwin(tree), "keys", "create", "--role", "viewer", "--name", "bench"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@contextlib.contextmanager
def api_server(tree: Path, env: dict[str, str], log: Path | None = None) -> Iterator[int]:
    """`finetwin api` on a free port, its output in `log` (else dropped); yields the port once it accepts
    connections."""
    port = free_port()
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(log.open("w")) if log is not None else subprocess.DEVNULL
        server = subprocess.Popen(
            [*finetwin(tree), "api", "--port", str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 60
            while not port_open(port):
                if server.poll() is not None or time.monotonic() > deadline:
                    said = f": {log.read_text()[-2000:]}" if log is not None else ""
                    raise SystemExit(f"the API did not start{said}")
                time.sleep(0.1)  # waiting for another process's port: nothing to await
            yield port
        finally:
            server.terminate()
            server.wait(timeout=60)


def warm_up(port: int, key: str) -> None:
    """The models loaded and BASE answered once, before any clock starts."""
    check = httpx.post(
        f"http://127.0.0.1:{port}/v1/advise", json=BASE, headers={"X-API-Key": key}, timeout=120
    )
    if check.status_code != 200:
        raise SystemExit(f"advise failed: {check.status_code} {check.text[:300]}")
    # The server compiles the version's trees in the background (calibrate/native_trees.py) and answers
    # from the tree walker (or, in checkouts before it, Treelite) meanwhile: the clock starts once they run
    # natively (checkouts without it say nothing).
    deadline = time.monotonic() + 180
    while True:
        listed = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"X-API-Key": key}).json()
        trees = listed.get("trees")
        if trees in (None, "native", "walker", "treelite") or time.monotonic() > deadline:
            print(f"trees: {trees}", file=sys.stderr)
            return
        time.sleep(0.2)  # another process's compile: nothing here to await


def scenarios(port: int, key: str, clients: int, seconds: float, seed: int) -> dict[str, Row]:
    """name -> (requests/s, p50, p99, max, errors)."""
    rows: dict[str, Row] = {}

    def run(
        name: str, n: int, bodies: Iterator, interval: float | None, *, until_exhausted: bool = False
    ) -> None:
        began = time.perf_counter()
        latencies, errors = uvloop.run(
            load(port, key, n, seconds, bodies, interval, until_exhausted=until_exhausted)
        )
        elapsed = time.perf_counter() - began if until_exhausted else seconds
        rows[name] = (
            len(latencies) / elapsed, percentile(latencies, 0.5), percentile(latencies, 0.99), max(latencies),
            errors,
        )  # fmt: skip

    new = distinct_configs(seed=seed, cold=True)
    run(f"1 client, {SINGLE_CLIENT_QUESTIONS} new configs", 1,
        itertools.islice(new, SINGLE_CLIENT_QUESTIONS), None, until_exhausted=True)  # fmt: skip
    run(f"{clients} clients x 1 req/s, new configs", clients, new, 1.0)
    run(f"{clients} clients closed loop, new configs", clients, new, None)
    run(f"{clients} clients closed loop, one config", clients, itertools.repeat(BASE), None)
    run(f"{clients} clients closed loop, GET /healthz", clients, itertools.repeat(None), None)
    return rows


Row = tuple[float, float, float, float, int]


def measure_tree(tree: Path, clients: int, seconds: float, seed: int) -> dict[str, Row]:
    with tempfile.TemporaryDirectory(prefix="finetwin-bench-api-") as tmp:
        work = Path(tmp)
        env = api_env(tree, work, fit_models(tree, work))
        key = viewer_key(tree, env)
        with api_server(tree, env) as port:
            warm_up(port, key)
            return scenarios(port, key, clients, seconds, seed)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--baseline", action="append", default=[], metavar="NAME=DIR",
        help="another checkout to measure in the same run (repeatable)",
    )  # fmt: skip
    args = parser.parse_args()
    trees = {"this checkout": REPO} | {
        name: Path(path).resolve() for name, path in (b.split("=", 1) for b in args.baseline)
    }
    p50, worst = in_process()
    print(f"in process, this checkout: advise_job on {SINGLE_CLIENT_QUESTIONS} new configs, "
          f"p50 {p50:.1f} ms, max {worst:.1f} ms", file=sys.stderr)  # fmt: skip
    results = {name: measure_tree(tree, args.clients, args.seconds, seed=1) for name, tree in trees.items()}

    n = args.clients
    print(f"{'scenario':<40}{'checkout':>22}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'errors':>7}")
    for scenario in results["this checkout"]:
        for name, rows in results.items():
            rate, p50, p99, worst, errors = rows[scenario]
            print(f"{scenario:<40}{name:>22}{rate:>8.0f}{p50:>9.1f}{p99:>9.1f}{worst:>9.1f}{errors:>7}")
    print()
    print(f"{'target':<34}{'checkout':>22}{'value':>9}{'target':>9}{'ratio':>8}  ok")
    single = f"1 client, {SINGLE_CLIENT_QUESTIONS} new configs"
    paced = f"{n} clients x 1 req/s, new configs"
    checks = [("1 client p50", single, 1), ("1 client max", single, 3), (f"{n} clients x 1/s p99", paced, 2)]
    for label, scenario, column in checks:
        target = TARGETS_MS[label.replace(str(n), "50")]
        for name, rows in results.items():
            value = rows[scenario][column]
            ok = "yes" if value <= target else "NO"
            print(f"{label:<34}{name:>22}{value:>9.1f}{target:>9.0f}{value / target:>8.2f}  {ok}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
