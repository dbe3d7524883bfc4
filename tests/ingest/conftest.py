"""Fixtures and helpers for the ingest tests: the sample's replay plan, topics, a worker thread on the real
broker, `finetwin ingest` processes, and a check of the store against the benchmark rows."""

from __future__ import annotations

import http.client
import math
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd
import pytest
from sqlalchemy import Engine, func, select

from calibrate.loader import load_benchmark
from finetwin.schema import migrate
from ingest.bus import KafkaBus, create_topic, make_consumer
from ingest.events import Event
from ingest.replay import ReplayPlan, plan_replay
from ingest.worker import IngestWorker
from tests.conftest import wait_for
from twin.db import make_engine
from twin.store import Job, ObservedRun, TelemetryEvent

PARTITIONS = 6
FINETWIN = str(Path(sys.executable).with_name("finetwin"))


@pytest.fixture(scope="session")
def sample_table(sample_csv: Path) -> pd.DataFrame:
    return load_benchmark(sample_csv)


@pytest.fixture(scope="session")
def sample_plan(sample_table: pd.DataFrame) -> ReplayPlan:
    """The whole real sample as telemetry (seed 0, job ids `replay-0-<line>`)."""
    return plan_replay(sample_table, seed=0)


def new_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> str:
    create_topic(bootstrap, name, partitions)
    return name


def produce(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes]]) -> None:
    producer = KafkaBus(bootstrap).producer()
    try:
        for key, value in messages:
            producer.send(topic, value, key)
        producer.flush()
    finally:
        producer.close()


def as_messages(events: Sequence[Event]) -> list[tuple[bytes | None, bytes]]:
    return [(event.key.encode(), event.to_json()) for event in events]


def read_topic(bootstrap: str, topic: str, count: int, timeout_s: float = 30) -> list:  # type: ignore[type-arg]
    """The first `count` records of a topic, every partition from the start (no group: end offsets are not
    to be trusted on Tansu, so this waits for the count)."""
    consumer = make_consumer(bootstrap, None, None)
    try:
        from kafka.structs import TopicPartition

        partitions = wait_for(lambda: consumer.partitions_for_topic(topic), 10, f"topic {topic}")
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        records: list = []  # type: ignore[type-arg]

        def more() -> bool:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
            return len(records) >= count

        wait_for(more, timeout_s, f"{count} records on {topic} (have {len(records)})")
        return records
    finally:
        consumer.close(autocommit=False)


@contextmanager
def worker_thread(
    engine: Engine, bootstrap: str, topic: str, group: str, dlq_topic: str, batch_size: int = 500
) -> Iterator[tuple[IngestWorker, threading.Thread]]:
    """An IngestWorker on the real broker, running in a thread until the block ends (then drained)."""
    bus = KafkaBus(bootstrap)
    worker = IngestWorker(
        engine, bus.consumer(topic, group), bus.producer(), dlq_topic=dlq_topic, batch_size=batch_size
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name="test-ingest", daemon=True)
    thread.start()
    try:
        yield worker, thread
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not stop"


def same_event(event: Any, model: Any) -> bool:
    """The same event, field by field, whether each is a pydantic event (`parse_event`) or the worker's
    fast-path struct (`ingest.fastparse`); floats are compared by their JSON text, so -0.0 is not 0.0."""
    envelope = ("type", "schema_version", "event_id", "cluster_id", "job_id")
    if any(getattr(event, name) != getattr(model, name) for name in envelope):
        return False
    if event.ts != model.ts or event.ts.utcoffset() != model.ts.utcoffset():
        return False
    return msgspec.json.encode(dict(event.payload)) == msgspec.json.encode(dict(model.payload))


def store_count(engine: Engine, table: type = TelemetryEvent) -> int:
    with engine.connect() as connection:
        return int(connection.execute(select(func.count()).select_from(table)).scalar_one())


@pytest.fixture
def pg_engine(postgres_url: str) -> Iterator[Engine]:
    engine = make_engine(postgres_url)
    migrate(engine)
    yield engine
    engine.dispose()


# --- `finetwin ingest` processes ---------------------------------------------------------------------------


class IngestProcess:
    """`finetwin ingest` as a child process, with its Prometheus metrics on a port of its own."""

    def __init__(
        self, database_url: str, bootstrap: str, topic: str, group: str, tmp: Path, processes: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        from ingest.broker import free_port

        self.metrics_port = free_port(processes)  # with --processes N: consumer i serves on metrics_port + i
        self.log_path = tmp / f"ingest-{self.metrics_port}.log"
        env = {
            **os.environ,
            "FINETWIN_DATABASE_URL": database_url,
            "FINETWIN_DLQ_TOPIC": f"{topic}.dlq",
            "FINETWIN_DATA_DIR": str(tmp / "data"),
            "FINETWIN_MODELS_DIR": str(tmp / "no-models"),
            **(env or {}),
        }
        command = [
            FINETWIN, "ingest", "--bootstrap", bootstrap, "--topic", topic,
            "--group", group, "--metrics-port", str(self.metrics_port), "--processes", str(processes),
        ]  # fmt: skip
        self.log = open(self.log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(command, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def metric(self, name: str, consumer: int = 0) -> float | None:
        """A metric's current value (of consumer i of --processes N), or None while it is not served (yet)."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port + consumer}/metrics"
            with urllib.request.urlopen(url, timeout=2) as reply:
                text = reply.read().decode()
        except (OSError, http.client.HTTPException):
            # Not listening yet (a probe can meet itself: ingest.broker.reaches_a_listener), or not answering
            # HTTP yet. Or exited: then a wait for a metric could end only in its timeout, so say why now.
            if self.process.poll() is not None:
                pytest.fail(f"finetwin ingest exited ({self.process.returncode}):\n{self.output()[-3000:]}")
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return math.nan

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout_s: float = 30) -> int:
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"finetwin ingest did not exit within {timeout_s:.0f} s:\n{self.output()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def ingest_processes(tmp_path: Path) -> Iterator[list[IngestProcess]]:
    """Start processes by appending `IngestProcess(...)`; any still running are killed at the end."""
    started: list[IngestProcess] = []
    yield started
    for process in started:
        process.stop()


# --- the store against the benchmark ----------------------------------------------------------------------


def assert_store_matches_benchmark(
    engine: Engine, table: pd.DataFrame, plan: ReplayPlan, prefix: str
) -> None:
    """Every row's job is in the store once, with the row's outcome, rule, configuration and measurements,
    and every event of the plan is stored exactly once."""
    with engine.connect() as connection:
        jobs = {row.job_id: row for row in connection.execute(select(Job))}
        runs = {row.job_id: row for row in connection.execute(select(ObservedRun))}
        event_ids = connection.execute(select(TelemetryEvent.event_id)).scalars().all()
    planned = {str(event.event_id) for _, event in plan.events}
    assert len(event_ids) == len(set(event_ids)) == len(planned)
    assert set(event_ids) == planned
    mine = {job_id: job for job_id, job in jobs.items() if job_id.startswith(prefix)}
    assert len(mine) == len(table)
    for row in table.itertuples(index=False):
        job = mine[f"{prefix}{row.line}"]
        assert job.outcome == row.outcome, row.line
        assert (job.model_name, job.gpu_model, job.number_gpus, job.batch_size, job.method) == (
            row.model_name, row.gpu_model, row.number_gpus, row.batch_size, row.method,
        )  # fmt: skip
        if row.outcome == "rejected":
            assert job.rule == row.rule and job.job_id not in runs
            continue
        run = runs[job.job_id]
        if row.outcome == "valid":
            assert run.is_valid == 1
            assert run.dataset_tokens_per_second == pytest.approx(row.dataset_tokens_per_second, rel=1e-12)
            assert run.train_runtime == pytest.approx(row.train_runtime, rel=1e-12)
        else:
            assert run.is_valid == 0 and job.failure_reason == "oom"
