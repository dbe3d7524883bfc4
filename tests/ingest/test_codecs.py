"""Any producer's telemetry: librdkafka (confluent-kafka) producing with each compression codec Kafka has, to
the real Tansu broker, is applied by the worker; a batch the worker cannot decode stops it loudly (a log line
naming topic, partition and offset, a metric, a non-zero exit), never in a silent spin; SIGTERM stops
`finetwin ingest` within seconds, with the broker there or gone."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from finetwin.schema import migrate
from ingest.broker import EmbeddedBroker
from ingest.bus import KafkaBus, UndecodableBatch
from ingest.events import JobSubmitted, new_event
from ingest.worker import IngestWorker
from tests.conftest import unique, wait_for
from tests.ingest.conftest import IngestProcess, new_topic, store_count
from twin.db import make_engine

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
EVENTS = 200
APPLIED = "finetwin_ingest_events_applied_total"


def produce_with_librdkafka(bootstrap: str, topic: str, codec: str, count: int = EVENTS) -> None:
    """`count` job.submitted events, as a cluster's librdkafka producer sends them: batched and compressed."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20, "acks": "all"}
    )
    payload = JobSubmitted(
        model_name="llama3-8b", method="lora", gpu_model="L40S", number_gpus=2, number_nodes=1, batch_size=8,
        tokens_per_sample=1024,
    )  # fmt: skip
    for n in range(count):
        event = new_event("job.submitted", payload, job_id=f"{codec}-{n}")
        producer.produce(topic, event.to_json(), event.key.encode())
    assert producer.flush(30) == 0, "librdkafka did not deliver everything"


@pytest.fixture
def sqlite_engine(sqlite_url: str) -> Engine:
    engine = make_engine(sqlite_url)
    migrate(engine)
    return engine


@pytest.mark.parametrize("codec", CODECS)
def test_every_compression_codec_is_applied(kafka_bootstrap: str, sqlite_engine: Engine, codec: str) -> None:
    topic = new_topic(kafka_bootstrap, unique(f"codec-{codec}"), partitions=1)
    produce_with_librdkafka(kafka_bootstrap, topic, codec)
    bus = KafkaBus(kafka_bootstrap)
    worker = IngestWorker(
        sqlite_engine, bus.consumer(topic, unique("g")), bus.producer(), dlq_topic=f"{topic}.dlq"
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert worker.wait_until(lambda s: s.messages >= EVENTS or not thread.is_alive(), timeout_s=60)
    finally:
        stop.set()
        thread.join(30)
    assert (worker.stats.applied, worker.stats.dead_letters) == (EVENTS, 0)
    assert store_count(sqlite_engine) == EVENTS


def test_a_batch_the_worker_cannot_decode_stops_it_loudly_and_loses_nothing(
    kafka_bootstrap: str,
    sqlite_engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker without the snappy library (as one deployed without it): the snappy batch stops it within
    seconds, with the batch's topic, partition and offset in a critical log line and in the metric, and the
    offset uncommitted, so a worker that has the codec then applies every event."""
    import kafka.codec

    topic = new_topic(kafka_bootstrap, unique("nocodec"), partitions=1)
    produce_with_librdkafka(kafka_bootstrap, topic, "snappy")
    group = unique("g")
    bus = KafkaBus(kafka_bootstrap)
    metric = {"topic": topic, "partition": "0"}
    before = REGISTRY.get_sample_value("finetwin_ingest_undecodable_batches_total", metric) or 0.0
    monkeypatch.setattr(kafka.codec, "snappy", None)  # kafka-python finds no snappy library
    worker = IngestWorker(sqlite_engine, bus.consumer(topic, group), bus.producer(), dlq_topic=f"{topic}.dlq")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(threading.Event())
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    with caplog.at_level(logging.CRITICAL, logger="ingest.worker"):
        thread.start()
        thread.join(60)
    assert not thread.is_alive(), "the worker spins on a batch it cannot decode"
    assert len(failure) == 1 and isinstance(failure[0], UndecodableBatch)
    assert f"topic {topic} partition 0 offset 0" in caplog.text and "snappy" in caplog.text
    assert REGISTRY.get_sample_value("finetwin_ingest_undecodable_batches_total", metric) == before + 1
    assert store_count(sqlite_engine) == 0

    monkeypatch.undo()  # the codec is installed again: a new worker of the group takes it from there
    worker = IngestWorker(sqlite_engine, bus.consumer(topic, group), bus.producer(), dlq_topic=f"{topic}.dlq")
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    thread.start()
    try:
        assert worker.wait_until(lambda s: s.applied >= EVENTS, timeout_s=60), worker.stats
    finally:
        stop.set()
        thread.join(30)


def test_finetwin_ingest_exits_non_zero_at_a_batch_it_cannot_decode(
    kafka_bootstrap: str, sqlite_url: str, ingest_processes: list[IngestProcess], tmp_path: Path
) -> None:
    """The command, in a Python where `import snappy` fails: exits with status 3 by itself, saying where."""
    topic = new_topic(kafka_bootstrap, unique("nocodec"), partitions=1)
    produce_with_librdkafka(kafka_bootstrap, topic, "snappy", count=20)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "snappy.py").write_text('raise ImportError("hidden by the test: no snappy library")\n')
    command = IngestProcess(
        sqlite_url, kafka_bootstrap, topic, unique("g"), tmp_path, env={"PYTHONPATH": str(shadow)}
    )
    ingest_processes.append(command)
    assert command.wait(60) == 3
    output = command.output()
    assert f"cannot decode the record batch at topic {topic} partition 0 offset 0" in output, output[-3000:]


@pytest.mark.parametrize("state", ["idle", "broker gone"])
def test_sigterm_stops_finetwin_ingest_within_seconds(
    state: str, sqlite_url: str, ingest_processes: list[IngestProcess], tmp_path: Path
) -> None:
    """SIGTERM while waiting for messages, and after the broker died under it: exits within 20 s."""
    with EmbeddedBroker() as broker:
        topic = new_topic(broker.bootstrap, unique("term"), partitions=2)
        command = IngestProcess(sqlite_url, broker.bootstrap, topic, unique("g"), tmp_path)
        ingest_processes.append(command)
        produce_with_librdkafka(broker.bootstrap, topic, "none", count=10)
        wait_for(lambda: (command.metric(APPLIED) or 0) >= 10, 60, "the events to be applied")
        if state == "broker gone":
            broker.kill()
            time.sleep(1)  # the worker is now polling a broker that is gone (no event to await from outside)
        started = time.monotonic()
        command.process.send_signal(signal.SIGTERM)
        status = command.wait(30)
        elapsed = time.monotonic() - started
    assert elapsed < 20, f"{elapsed:.1f} s to stop:\n{command.output()[-2000:]}"
    assert status in (0, 1), command.output()[-2000:]  # 1: the stop deadline cut a wait on the gone broker
    assert "stopped:" in command.output() or status == 1


def test_a_stop_held_up_past_the_deadline_exits_anyway(tmp_path: Path) -> None:
    """The last resort behind SIGTERM: a process whose loop does not return after the signal (a call that
    waits on a broker or database that is gone) exits with status 1 once the deadline passes."""
    import subprocess
    import sys

    script = (
        "import logging, threading, time\n"
        "from finetwin.signals import stop_on_signals\n"
        "logging.basicConfig()\n"
        "stop = threading.Event()\n"
        "with stop_on_signals(stop, deadline_s=0.5):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)  # held up: never looks at `stop`\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        _, errors = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 1 and time.monotonic() - started < 10
    assert "exiting now" in errors


def test_finetwin_up_stops_with_its_ingest_at_a_batch_it_cannot_decode(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """`finetwin up` runs the worker in a thread: a batch it cannot decode stops the whole command (status 3)
    rather than leave the API serving with ingest dead."""
    import os
    import subprocess

    from ingest.broker import free_port
    from tests.ingest.conftest import FINETWIN

    topic = new_topic(kafka_bootstrap, unique("up-nocodec"), partitions=1)
    produce_with_librdkafka(kafka_bootstrap, topic, "snappy", count=20)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "snappy.py").write_text('raise ImportError("hidden by the test: no snappy library")\n')
    env = {
        **os.environ, "PYTHONPATH": str(shadow), "FINETWIN_DATA_DIR": str(tmp_path / "data"),
        "FINETWIN_SCHEDULER_ENABLED": "0", "FINETWIN_MODELS_DIR": str(tmp_path / "models"),
        "FINETWIN_TELEMETRY_TOPIC": topic, "FINETWIN_DLQ_TOPIC": f"{topic}.dlq",
        "FINETWIN_CONSUMER_GROUP": unique("g"),
    }  # fmt: skip
    env.pop("FINETWIN_DATABASE_URL", None)
    done = subprocess.run(
        [FINETWIN, "up", "--bootstrap", kafka_bootstrap, "--no-replay", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-3000:]
    assert f"cannot decode the record batch at topic {topic} partition 0 offset 0" in done.stderr
